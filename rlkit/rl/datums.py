"""Trajectories -> training datums for the policy-gradient losses.

A trajectory's tokens are ``ob_0 + ac_0 + ob_1 + ac_1 + ...``. Position *j-1* predicts token *j*,
so every action token *j* puts, at position *j-1*: weight 1, its sampler logprob, the trajectory's
advantage, and (optionally) the sampling temperature, so the trainer scores with the same
distribution the sampler drew from. Observation tokens carry weight 0.

A trajectory whose environment rewrote the context (``StepResult.next_context``) holds several
sequences; :func:`trajectory_datums` makes one datum per sequence, each action in the context it
was sampled in, all with the trajectory's advantage.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from rlkit.rl.env import Trajectory, Transition
from rlkit.types import GREEDY_TEMPERATURE, Datum, ModelInput


def _datum(transitions: Sequence[Transition], advantage: float, temperature: Optional[float]) -> Datum:
    tokens: List[int] = []
    weights: List[float] = []
    logprobs: List[float] = []
    for t in transitions:
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


def trajectory_datums(trajectory: Trajectory, advantage: float, temperature: Optional[float] = None) -> List[Datum]:
    """One datum per token sequence of ``trajectory`` (one, unless an env returned ``next_context``)."""
    groups: List[List[Transition]] = []
    for t in trajectory.transitions:
        if t.new_sequence or not groups:
            groups.append([])
        groups[-1].append(t)
    return [_datum(g, advantage, temperature) for g in groups]


def trajectory_datum(trajectory: Trajectory, advantage: float, temperature: Optional[float] = None) -> Datum:
    """The datum of a one-sequence trajectory (see :func:`trajectory_datums` for the general case)."""
    datums = trajectory_datums(trajectory, advantage, temperature)
    if len(datums) != 1:
        raise ValueError(f"this trajectory holds {len(datums)} token sequences; use trajectory_datums")
    return datums[0]
