"""Trajectories -> training datums for the policy-gradient losses.

A trajectory's tokens are ``ob_0 + ac_0 + ob_1 + ac_1 + ...``. Position *j-1* predicts token *j*,
so every action token *j* puts, at position *j-1*: weight 1, its sampler logprob, the trajectory's
advantage, and (optionally) the sampling temperature, so the trainer scores with the same
distribution the sampler drew from. Observation tokens carry weight 0.
"""

from __future__ import annotations

from typing import List, Optional

from rlkit.rl.env import Trajectory
from rlkit.types import GREEDY_TEMPERATURE, Datum, ModelInput


def trajectory_datum(trajectory: Trajectory, advantage: float, temperature: Optional[float] = None) -> Datum:
    tokens: List[int] = []
    weights: List[float] = []
    logprobs: List[float] = []
    for t in trajectory.transitions:
        tokens += t.observation
        weights += [0.0] * len(t.observation)
        logprobs += [0.0] * len(t.observation)
        tokens += t.action
        weights += [1.0] * len(t.action)
        lps = list(t.action_logprobs) + [0.0] * (len(t.action) - len(t.action_logprobs))
        logprobs += lps
    # shift: the value for token j lives at position j-1
    n = len(tokens)
    inputs = {
        "target_tokens": tokens[1:] + [0],
        "weights": weights[1:] + [0.0],
        "logprobs": logprobs[1:] + [0.0],
        "advantages": [advantage * w for w in weights[1:]] + [0.0],
    }
    if temperature is not None and temperature >= GREEDY_TEMPERATURE:  # a greedy sample's logprobs are at T = 1
        inputs["temperature"] = [float(temperature)] * n
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs=inputs)
