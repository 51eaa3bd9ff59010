"""Sampled sequences and trajectories -> training datums for the policy-gradient losses.

For a loop of your own, :func:`sequence_datum` turns one ``sample`` result (prompt + completion,
with the sampler's logprobs) and its advantage into a :class:`~rlkit.types.Datum`, and
:func:`group_datums` does a whole GRPO group from its rewards::

    response = sampler.sample(prompt, num_samples=8, sampling_params=params).result()
    rewards = [my_reward(tokenizer.decode(s.tokens)) for s in response.sequences]
    datums = group_datums(prompt, response, rewards)            # GRPO advantages, shift convention
    trainer.forward_backward(datums, "importance_sampling")     # or "ppo", "cispo", run_loss(...)

The convention (every per-token input has one value per token of ``model_input``, prompt
included): with ``tokens = prompt + completion`` and ``P = len(prompt)``, position ``i`` predicts
token ``i + 1``, so ``target_tokens[i] = tokens[i + 1]`` (and ``0`` at the last position);
``weights[i] = 1`` for ``i`` in ``[P - 1, P + len(completion) - 2]`` (the positions whose target is
a completion token) and 0 elsewhere (the prompt, the last position); ``logprobs[i]`` is the
sampler's logprob of ``tokens[i + 1]`` there and 0 elsewhere; ``advantages[i] = A * weights[i]``.

A trajectory's tokens are ``ob_0 + ac_0 + ob_1 + ac_1 + ...``. Position *j-1* predicts token *j*,
so every action token *j* puts, at position *j-1*: weight 1, its sampler logprob, the trajectory's
advantage, and (optionally) the sampling temperature, so the trainer scores with the same
distribution the sampler drew from. Observation tokens carry weight 0.

A trajectory whose environment rewrote the context (``StepResult.next_context``) holds several
sequences; :func:`trajectory_datums` makes one datum per sequence, each action in the context it
was sampled in, all with the trajectory's advantage.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from rlkit.errors import InvalidInputError
from rlkit.rl.env import Trajectory, Transition
from rlkit.types import GREEDY_TEMPERATURE, Datum, ModelInput, SampledSequence, SampleResponse


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


def sequence_datum(
    prompt: Union[ModelInput, Sequence[int]],
    completion: Union[SampledSequence, Sequence[int]],
    advantage: float,
    *,
    logprobs: Optional[Sequence[float]] = None,
    temperature: Optional[float] = None,
) -> Datum:
    """The RL datum of one sampled completion of ``prompt`` (see the module docstring for the
    shift convention): ``target_tokens``, ``weights``, ``logprobs`` (the sampler's: from the
    :class:`~rlkit.types.SampledSequence`, or given) and ``advantages``; ``temperature`` (the
    sampling temperature) adds a per-token ``temperature`` input so the trainer scores the same
    distribution. Ready for the built-in ``importance_sampling``/``ppo``/``cispo`` losses."""
    prompt_tokens = prompt.to_ints() if isinstance(prompt, ModelInput) else [int(t) for t in prompt]
    if isinstance(completion, SampledSequence):
        tokens, sampled = list(completion.tokens), completion.logprobs
    else:
        tokens, sampled = [int(t) for t in completion], None
    sampled = list(logprobs) if logprobs is not None else sampled
    if not prompt_tokens:
        raise InvalidInputError("sequence_datum: the prompt is empty (the first completion token needs a position to predict it)")
    if sampled is None:
        raise InvalidInputError("sequence_datum: no sampler logprobs (pass a SampledSequence from sample(), or logprobs=)")
    if len(sampled) != len(tokens):
        raise InvalidInputError(f"sequence_datum: {len(tokens)} completion tokens but {len(sampled)} logprobs")
    action = Transition(observation=prompt_tokens, action=tokens, action_logprobs=[float(x) for x in sampled])
    return _datum([action], float(advantage), temperature)


def group_datums(
    prompt: Union[ModelInput, Sequence[int]],
    response: Union[SampleResponse, Sequence[SampledSequence]],
    rewards: Sequence[float],
    *,
    advantage: str = "grpo",
    temperature: Optional[float] = None,
    drop_zero_variance: bool = True,
) -> List[Datum]:
    """The datums of one group: ``response``'s sequences (``sample(prompt, num_samples=G)``) with
    group-relative advantages of ``rewards`` (``advantage``: ``grpo``, ``dr_grpo`` or ``rloo``,
    :mod:`rlkit.rl.advantages`). A group whose rewards are all equal carries no gradient: ``[]``
    unless ``drop_zero_variance=False`` (then its datums have zero advantages)."""
    from rlkit.rl.advantages import compute_advantages

    sequences: List[Any] = list(response.sequences if isinstance(response, SampleResponse) else response)
    if len(sequences) != len(rewards):
        raise InvalidInputError(f"group_datums: {len(sequences)} sequences but {len(rewards)} rewards")
    if drop_zero_variance and len(set(float(r) for r in rewards)) <= 1:
        return []
    advantages = compute_advantages([float(r) for r in rewards], advantage)
    return [sequence_datum(prompt, seq, adv, temperature=temperature) for seq, adv in zip(sequences, advantages)]
