"""The session contract's own test suite, run against any engine through rlkit's clients.

Each check returns :class:`Result` rows with a status:

- ``pass``      the engine does what the contract says, within the stated tolerance;
- ``refused``   the engine declines an option it does not support, in one clear error (allowed);
- ``wrong``     the engine answered, but not what the contract says (the measured difference is
                in ``detail``): a loop would silently train something else;
- ``error``     the engine failed a call it should have served.

How loss maths is checked without trusting the engine's own reports. With ``AdamParams(eps=E,
weight_decay=0)`` and ``E`` far above every gradient element, Adam's first step is
``dtheta = -lr * g / E``: linear in the gradient. So

- ``cross_entropy``: the change of ``L = -sum w log p`` (computed here from the trainer's logprobs
  before and after one step) must be, to first order, ``-(lr/E) * |g|^2`` with ``|g|`` the grad
  norm ``optim_step`` reports — a gradient scaled by ``c`` moves ``L`` by ``c`` but predicts ``c^2``;
- every other built-in: from the same saved state, one step with the engine's built-in and one
  step with rlkit's reference loss run linearised (``forward``, then ``cross_entropy`` with weights
  ``-dL/dlogp``: only the already-checked cross-entropy on the engine) must move the trainer's
  logprobs identically (relative difference of the two moves).

The data decide what such a comparison can see: two engines whose clips differ step identically
unless some weighted token's ratio ``p/q`` lies between their two thresholds (a server clipping at
0.7 / 1.3 by default passed a check whose ratios were 0.6, 0.82, 0.95, 1.05, 1.18, 1.65). So every
clip threshold checked — the configured :data:`CLIP` 0.85 / 1.15 and the documented defaults
:data:`DEFAULT_CLIP` 0.8 / 1.2, sent with no ``loss_fn_config`` (written here, not read from rlkit's
loss classes) — has a ratio half a :data:`NEIGHBOUR` (0.05) below it and one half above it
(:data:`RATIOS`: 0.775, 0.825, 0.875, 1.125, 1.175, 1.225, besides 0.6 and 1.65 outside every bound
and 0.95, 1.05 inside), each at a weighted token with a positive advantage (one datum, +0.9) and
with a negative one (the other, -0.6): PPO's high clip bites only where ``A > 0``, its low clip only
where ``A < 0``. A threshold off by 0.05 either way then changes some token's gradient (PPO: drops
or restores it; CISPO: rescales it by 0.025), far beyond :data:`LOSS_TOLERANCE`.

Temperature: sampled logprobs are under ``softmax(z / T)``. For two tokens drawn at one context,
``log p_T(a) - log p_T(b) = (log p_1(a) - log p_1(b)) / T`` whatever the normaliser, so samples at
``T != 1`` scored at temperature 1 check it on every engine; where the trainer takes the per-datum
``temperature`` input, its scoring at ``T`` must equal the sampled logprobs too.

Weight decay: AdamW's decay is decoupled, ``theta <- theta * (1 - lr * wd)`` besides the Adam step,
which a zero gradient leaves at zero. A zero-gradient step must leave a trained adapter exactly
where it is with ``wd = 0``, and with ``wd > 0`` scale it (``B @ A``: both factors) by
``(1 - lr * wd)^2`` — checked as the identical model that the adapter's one training step at a
learning rate scaled by that factor gives (Adam's first step is linear in the learning rate).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from rlkit.errors import RlkitError
from rlkit.losses.base import datum_input
from rlkit.losses.builtin import BUILTIN_LOSSES
from rlkit.losses.execute import per_datum_logprobs, run_loss
from rlkit.session import DEFAULT_LORA_ALPHA
from rlkit.types import AdamParams, Datum, ModelInput, SamplingParams

#: Adam's first step is ~ -lr * g / eps when eps >> |g_i| (weight decay off): linear in g
LINEAR_ADAM = AdamParams(learning_rate=1e-2, eps=1e3, weight_decay=0.0)
#: for engines whose optimizer range refuses LINEAR_ADAM (SageMaker: eps <= 0.01)
PLAIN_ADAM = AdamParams(learning_rate=1e-3, weight_decay=0.0)
#: the clip bounds the checks configure (not the defaults 0.8 / 1.2, so a config that is ignored shows)
CLIP = {"clip_low_threshold": 0.85, "clip_high_threshold": 1.15}
LOSS_TOLERANCE = 1e-3  # relative difference of two logprob moves computed from the same gradient
FIRST_ORDER_TOLERANCE = 0.02  # cross-entropy: measured vs predicted change (first-order terms only)
LOGPROB_TOLERANCE = 1e-3  # sampled vs scored logprobs (nats)
#: the built-ins' documented defaults (DESIGN §2, docs/tinker.md): what an engine must use when no config is sent
DEFAULT_CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
#: a clip threshold off by this much either way must fail its check: every threshold checked has a
#: ratio strictly between it and it -+ NEIGHBOUR on each side (half way, NEIGHBOUR / 2 from it)
NEIGHBOUR = 0.05
#: the ratios p/q of the RL checks' weighted tokens: each threshold of CLIP and DEFAULT_CLIP
#: +- NEIGHBOUR / 2 (0.775, 0.825, 0.875, 1.125, 1.175, 1.225), 0.6 and 1.65 outside every bound,
#: 0.95 and 1.05 inside every bound
RATIOS = tuple(sorted({round(v + s * NEIGHBOUR / 2, 6) for v in (*CLIP.values(), *DEFAULT_CLIP.values()) for s in (-1, 1)}
                      | {0.6, 0.95, 1.05, 1.65}))
#: the advantage of every weighted token of the first RL datum and of the second (one sign each:
#: PPO's high clip bites where A > 0, its low clip where A < 0)
ADVANTAGES = (0.9, -0.6)
RL_PROMPT_LEN = 3  # sft_datum weights positions prompt_len - 1 .. n - 2
SAMPLE_TEMPERATURE = 0.7  # the temperature the sampled-logprob checks sample at (not 1, so an ignored one shows)
#: the weight-decay check's first step, and its zero-gradient step (inside SageMaker's ranges: lr <= 0.01, weight decay <= 1)
DECAY_TRAIN = AdamParams(learning_rate=1e-2, weight_decay=0.0)
DECAY_STEP = AdamParams(learning_rate=1e-2, weight_decay=1.0)
DECAY_TOLERANCE = 1e-3  # the decayed adapter vs the same first step at lr * (1 - lr * wd)^2 (the same model: float noise only)
STILL_TOLERANCE = 1e-3  # weight decay 0: the move allowed, relative to the move weight decay DECAY_STEP predicts


@dataclass
class Result:
    check: str
    status: str  # pass | refused | wrong | error
    detail: str = ""


@dataclass
class Context:
    """What every check shares: the engine's service, one training client and its tokenizer."""

    service: Any
    trainer: Any
    base_model: str
    rank: int
    vocab: int
    progress: Callable[[str], None]
    adam: AdamParams = field(default_factory=lambda: LINEAR_ADAM)  # PLAIN_ADAM where LINEAR_ADAM's eps is refused


def _tokens(vocab: int, n: int, offset: int = 0) -> List[int]:
    """A fixed, engine-independent token sequence inside the vocabulary (no special tokens)."""
    return [(7 + 13 * (i + offset)) % max(vocab - 8, 1) + 4 for i in range(n)]


def sft_datum(tokens: Sequence[int], prompt_len: int) -> Datum:
    n = len(tokens)
    weights = [0.0 if i < prompt_len - 1 else 1.0 for i in range(n)]
    weights[-1] = 0.0
    return Datum(model_input=ModelInput.from_ints(list(tokens)), loss_fn_inputs={"target_tokens": list(tokens[1:]) + [0], "weights": weights})


def trainer_logprobs(trainer: Any, data: Sequence[Datum]) -> List[torch.Tensor]:
    return per_datum_logprobs(trainer.forward([sft_datum(d.model_input.to_ints(), 1) for d in data]).result())


def ce_value(data: Sequence[Datum], logprobs: Sequence[torch.Tensor]) -> float:
    """``-sum w log p`` over the batch, computed here from the trainer's logprobs."""
    return float(sum(-(datum_input(d, "weights") * lp).sum() for d, lp in zip(data, logprobs)))


def rl_base(vocab: int) -> List[Datum]:
    """The RL checks' two sequences, as SFT datums: each has exactly ``len(RATIOS)`` weighted tokens."""
    n = len(RATIOS) + RL_PROMPT_LEN  # weighted: positions RL_PROMPT_LEN - 1 .. n - 2
    return [sft_datum(_tokens(vocab, n), RL_PROMPT_LEN), sft_datum(_tokens(vocab, n, offset=5), RL_PROMPT_LEN)]


def rl_data(base: Sequence[Datum], logprobs: Sequence[torch.Tensor]) -> List[Datum]:
    """``base`` as RL datums whose sampler logprobs sit at the ratios :data:`RATIOS` from the
    trainer's ``logprobs``, one ratio per weighted token (ratio 1 elsewhere), with the datum's
    advantage of :data:`ADVANTAGES` on every token."""
    out = []
    for d, lp, advantage in zip(base, logprobs, ADVANTAGES):
        weighted = [i for i, w in enumerate(datum_input(d, "weights").tolist()) if w != 0]
        assert len(weighted) >= len(RATIOS), "every ratio needs a weighted token"
        log_ratio = [0.0] * d.model_input.length
        for k, i in enumerate(weighted):
            log_ratio[i] = math.log(RATIOS[k % len(RATIOS)])
        inputs = dict(d.loss_fn_inputs)
        inputs["logprobs"] = [float(lp[i]) - r for i, r in enumerate(log_ratio)]
        inputs["advantages"] = [advantage] * d.model_input.length
        out.append(Datum(model_input=d.model_input, loss_fn_inputs=inputs))
    return out


def rl_batch(ctx: Context) -> List[Datum]:
    """Two RL datums whose sampler logprobs sit at :data:`RATIOS` from the trainer's own."""
    base = rl_base(ctx.vocab)
    return rl_data(base, trainer_logprobs(ctx.trainer, base))


def _refusal(name: str, call: Callable[[], Any]) -> Result:
    try:
        out = call()
        if hasattr(out, "result"):
            out.result(timeout=600)
    except RlkitError as exc:
        return Result(name, "pass", f"refused: {str(exc).splitlines()[0][:110]}")
    except Exception as exc:  # noqa: BLE001 - a refusal that is not one line of rlkit's errors
        return Result(name, "wrong", f"failed with {type(exc).__name__} instead of a clear refusal")
    return Result(name, "wrong", "accepted (the option was silently ignored or mis-read)")


def check_refusals(ctx: Context) -> List[Result]:
    """Bad input is refused at the call site, never ignored."""
    good = sft_datum(_tokens(ctx.vocab, 8), 2)
    short = Datum(model_input=good.model_input, loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0]})
    results = [
        _refusal("refuses/unknown loss_fn", lambda: ctx.trainer.forward_backward([good], "grpo")),
        _refusal("refuses/unknown loss_fn_config key", lambda: ctx.trainer.forward_backward(rl_batch(ctx), "ppo", loss_fn_config={"clip_epsilon": 0.2})),
        _refusal("refuses/loss input of the wrong length", lambda: ctx.trainer.forward_backward([short])),
        _refusal("refuses/token outside the vocabulary", lambda: ctx.trainer.forward([sft_datum([1, ctx.vocab + 5, 2], 1)])),
    ]
    fixed = ctx.service.capabilities.fixed_lora_alpha
    if fixed is not None:
        results.append(_refusal("refuses/a LoRA alpha it cannot honour",
                                 lambda: ctx.service.create_lora_training_client(ctx.base_model, rank=ctx.rank, alpha=2 * fixed)))
    return results


def _moved(trainer: Any, probe: Sequence[Datum], before: Sequence[torch.Tensor]) -> torch.Tensor:
    after = trainer_logprobs(trainer, probe)
    return torch.cat([a - b for a, b in zip(after, before)])


def choose_optimizer(ctx: Context) -> None:
    """Use :data:`LINEAR_ADAM` where the engine accepts its eps, else :data:`PLAIN_ADAM` (the
    cross-entropy check then tests linearity in the weights instead of the first-order change)."""
    saved = ctx.trainer.save_state("conformance-start").result().model_package_arn
    try:
        ctx.trainer.optim_step(LINEAR_ADAM).result()  # no gradient is pending: nothing moves
    except RlkitError:
        ctx.adam = PLAIN_ADAM
    finally:  # every check starts from a fresh optimizer (Adam's first step), as load_state leaves it
        ctx.trainer.load_state(saved).result()


def check_cross_entropy(ctx: Context) -> List[Result]:
    """The first-order test of the module docstring (or, with an Adam that is not linear, that the
    gradient is linear in the weights: doubling ``w`` doubles the reported grad norm)."""
    data = [sft_datum(_tokens(ctx.vocab, 16), 4), sft_datum(_tokens(ctx.vocab, 10, offset=3), 2)]
    saved = ctx.trainer.save_state("conformance-ce").result().model_package_arn
    if ctx.adam is not LINEAR_ADAM:
        return [check_ce_linearity(ctx, data, saved)]
    before = trainer_logprobs(ctx.trainer, data)
    ctx.trainer.forward_backward(data, "cross_entropy").result()
    step = ctx.trainer.optim_step(ctx.adam).result()
    after = trainer_logprobs(ctx.trainer, data)
    ctx.trainer.load_state(saved).result()
    norm = step.metrics.get("grad_norm")
    if norm is None:
        return [Result("loss/cross_entropy", "error", "optim_step reports no grad_norm; the gradient cannot be checked")]
    measured = ce_value(data, after) - ce_value(data, before)
    predicted = -LINEAR_ADAM.learning_rate / LINEAR_ADAM.eps * float(norm) ** 2
    rel = abs(measured - predicted) / max(abs(predicted), 1e-12)
    status = "pass" if rel <= FIRST_ORDER_TOLERANCE else "wrong"
    return [Result("loss/cross_entropy", status, f"dL {measured:.4g} vs -(lr/eps)|g|^2 {predicted:.4g} (rel {rel:.1e})")]


def _scaled(data: Sequence[Datum], factor: float) -> List[Datum]:
    return [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "weights": (datum_input(d, "weights") * factor).tolist()})
            for d in data]


def check_ce_linearity(ctx: Context, data: Sequence[Datum], saved: str) -> Result:
    norms = []
    for factor in (1.0, 2.0):
        ctx.trainer.forward_backward(_scaled(data, factor), "cross_entropy").result()
        norms.append(float(ctx.trainer.optim_step(ctx.adam).result().metrics.get("grad_norm", math.nan)))
        ctx.trainer.load_state(saved).result()
    ratio = norms[1] / norms[0] if norms[0] else math.nan
    status = "pass" if abs(ratio - 2.0) <= 1e-4 else "wrong"
    return Result("loss/cross_entropy", status, f"grad norm x{ratio:.5f} for weights x2 (the engine's eps range rules out "
                  "the first-order test; its scale is checked by parity)")


def check_builtin(ctx: Context, name: str, *, defaults: bool = False) -> Result:
    """One built-in against rlkit's reference loss, from the same saved state: sent with
    :data:`CLIP` as its config, or (``defaults``) with no config, the reference then configured
    with :data:`DEFAULT_CLIP` explicitly."""
    label = f"loss/{name} with no loss_fn_config" if defaults else f"loss/{name}"
    if not ctx.trainer.capabilities.supports_builtin(name):
        return Result(label, "refused", "not a native built-in here (runs linearised)")
    cls, keys = BUILTIN_LOSSES[name]
    config = None if defaults else ({k: CLIP[k] for k in keys if k in CLIP} or None)
    reference_config = {k: DEFAULT_CLIP[k] for k in keys} if defaults else (config or {})
    batch = rl_batch(ctx)
    saved = ctx.trainer.save_state(f"conformance-{name}").result().model_package_arn
    before = trainer_logprobs(ctx.trainer, batch)
    ctx.trainer.forward_backward(batch, name, loss_fn_config=config).result()
    native_norm = ctx.trainer.optim_step(ctx.adam).result().metrics.get("grad_norm")
    native = _moved(ctx.trainer, batch, before)
    ctx.trainer.load_state(saved).result()
    restored = trainer_logprobs(ctx.trainer, batch)
    drift = max(float((a - b).abs().max()) for a, b in zip(restored, before))
    run_loss(ctx.trainer, batch, cls(**reference_config), force_linearised=True).result()
    reference_norm = ctx.trainer.optim_step(ctx.adam).result().metrics.get("grad_norm")
    reference = _moved(ctx.trainer, batch, before)
    ctx.trainer.load_state(saved).result()
    if drift > 1e-5:
        return Result(label, "error", f"load_state did not restore the saved weights (logprobs moved {drift:.1e})")
    if float(reference.norm()) == 0.0:
        return Result(label, "error", "the reference step did not move the model")
    rel = float((native - reference).norm() / reference.norm())
    scale = abs(float(native_norm) / float(reference_norm) - 1.0) if native_norm and reference_norm else 0.0
    status = "pass" if rel <= LOSS_TOLERANCE and scale <= LOSS_TOLERANCE else "wrong"
    detail = f"native vs reference: step rel diff {rel:.1e}, grad norm rel diff {scale:.1e}"
    if defaults:
        return Result(label, status, detail + f" (reference at the defaults {DEFAULT_CLIP})")
    return Result(label, status, detail + (f" (config {config})" if config else ""))


def check_builtin_defaults(ctx: Context) -> List[Result]:
    """Every built-in that takes a config, sent with none: the engine's defaults must be 0.8 / 1.2."""
    return [check_builtin(ctx, name, defaults=True) for name, (_, keys) in BUILTIN_LOSSES.items() if keys]


def check_weight_decay(ctx: Context) -> List[Result]:
    """AdamW's decoupled weight decay, exactly (module docstring). From the suite's new adapter
    (LoRA's ``B = 0``), one step at ``lr`` trains ``B`` only, by ``lr * g / (|g| + eps)``: linear in
    ``lr``. A zero-gradient step with weight decay ``wd`` then scales ``A`` and ``B`` by
    ``f = 1 - lr_d * wd``, i.e. the adapter ``B @ A`` by ``f^2`` — the same model as that first step
    at ``lr * f^2``. With ``wd = 0`` the zero-gradient step must move nothing."""
    probe = [sft_datum(_tokens(ctx.vocab, 12, offset=2), 2), sft_datum(_tokens(ctx.vocab, 10, offset=7), 3)]
    still = [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "weights": [0.0] * d.model_input.length})
             for d in probe]  # a gradient that exists and is zero everywhere
    factor = (1.0 - DECAY_STEP.learning_rate * DECAY_STEP.weight_decay) ** 2
    saved = ctx.trainer.save_state("conformance-decay").result().model_package_arn
    after = {}
    try:
        ctx.trainer.forward_backward(probe).result()
        ctx.trainer.optim_step(DECAY_TRAIN).result()
        trained_state = ctx.trainer.save_state("conformance-decay-trained").result().model_package_arn
        trained = trainer_logprobs(ctx.trainer, probe)
        for wd in (0.0, DECAY_STEP.weight_decay):
            ctx.trainer.load_state(trained_state).result()  # a fresh optimizer: zero moments, so Adam's own step is 0
            ctx.trainer.forward_backward(still).result()
            ctx.trainer.optim_step(AdamParams(learning_rate=DECAY_STEP.learning_rate, weight_decay=wd)).result()
            after[wd] = trainer_logprobs(ctx.trainer, probe)
        ctx.trainer.load_state(saved).result()
        ctx.trainer.forward_backward(probe).result()
        ctx.trainer.optim_step(AdamParams(learning_rate=DECAY_TRAIN.learning_rate * factor, weight_decay=0.0)).result()
        expected = trainer_logprobs(ctx.trainer, probe)
    finally:
        ctx.trainer.load_state(saved).result()

    def diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([x - y for x, y in zip(a, b)])

    predicted = diff(expected, trained)  # what the decay step should do to the logprobs
    if float(predicted.norm()) == 0.0:
        return [Result("optim/weight decay", "error", "a smaller first step gave the same logprobs: the adapter did not train")]
    still_move = float(diff(after[0.0], trained).abs().max())
    allowed = STILL_TOLERANCE * float(predicted.abs().max())
    rel = float(diff(after[DECAY_STEP.weight_decay], expected).norm() / predicted.norm())
    wd = f"{DECAY_STEP.weight_decay:g}"
    return [
        Result("optim/weight decay 0 leaves the weights alone", "pass" if still_move <= allowed else "wrong",
               f"a zero-gradient step with weight decay 0 moved logprobs {still_move:.1e} (allowed {allowed:.1e}: "
               f"{STILL_TOLERANCE:g} of what weight decay {wd} moves them)"),
        Result(f"optim/weight decay {wd} shrinks the adapter by (1 - lr*wd)^2", "pass" if rel <= DECAY_TOLERANCE else "wrong",
               f"vs the first step at lr x {factor:.4f}: rel diff {rel:.1e} of the move {float(predicted.norm()):.2e}"),
    ]


def check_save_load(ctx: Context) -> List[Result]:
    """save_state -> train -> load_state restores the weights; a sampler bound to a saved version
    keeps sampling from it after later training."""
    probe = [sft_datum(_tokens(ctx.vocab, 12), 2)]
    saved = ctx.trainer.save_state("conformance-roundtrip").result().model_package_arn
    before = trainer_logprobs(ctx.trainer, probe)
    sampler = ctx.trainer.save_weights_and_get_sampling_client("conformance-pinned")
    prompt = ModelInput.from_ints(_tokens(ctx.vocab, 8))
    pinned_before = sampler.compute_logprobs(prompt).result()
    ctx.trainer.forward_backward(probe).result()
    ctx.trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    moved = float((trainer_logprobs(ctx.trainer, probe)[0] - before[0]).abs().max())
    pinned_after = sampler.compute_logprobs(prompt).result()
    ctx.trainer.load_state(saved).result()
    drift = float((trainer_logprobs(ctx.trainer, probe)[0] - before[0]).abs().max())
    stale = max(abs(a - b) for a, b in zip(pinned_before[1:], pinned_after[1:]))
    return [
        Result("state/save_state then load_state", "pass" if moved > 1e-4 and drift <= 1e-5 else "wrong",
               f"training moved logprobs {moved:.1e}; after load_state {drift:.1e}"),
        Result("state/a sampler keeps its version", "pass" if stale <= 1e-6 else "wrong",
               f"its logprobs moved {stale:.1e} while training went on"),
    ]


def check_ordering(ctx: Context) -> List[Result]:
    """Operations submitted together run in submission order: a forward queued before a step sees
    the old weights, one queued after sees the new."""
    probe = [sft_datum(_tokens(ctx.vocab, 10), 2)]
    saved = ctx.trainer.save_state("conformance-order").result().model_package_arn
    before = trainer_logprobs(ctx.trainer, probe)[0]
    cross = [sft_datum(d.model_input.to_ints(), 1) for d in probe]
    f1 = ctx.trainer.forward(cross)
    fb = ctx.trainer.forward_backward(probe)
    opt = ctx.trainer.optim_step(AdamParams(learning_rate=1e-2))
    f2 = ctx.trainer.forward(cross)
    first, second = (per_datum_logprobs(f.result())[0] for f in (f1, f2))
    fb.result(), opt.result()
    ctx.trainer.load_state(saved).result()
    ok = float((first - before).abs().max()) <= 1e-5 and float((second - before).abs().max()) > 1e-4
    return [Result("order/submission order", "pass" if ok else "wrong",
                   f"queued-before forward moved {float((first - before).abs().max()):.1e}, queued-after {float((second - before).abs().max()):.1e}")]


def check_sampling(ctx: Context) -> List[Result]:
    """Sampled logprobs equal the engine's scoring of the same tokens (at temperature 1), the first
    prompt logprob is None, and a per-request seed repeats a sample (where declared)."""
    sampler = ctx.trainer.save_weights_and_get_sampling_client("conformance-sampler")
    prompt = _tokens(ctx.vocab, 6)
    seeded = ctx.trainer.capabilities.per_request_seed  # an engine without seeds is asked for none (vLLM's CPU build)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11 if seeded else None)
    response = sampler.sample(ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result()
    results = []
    worst = 0.0
    for seq in response.sequences:
        scored = sampler.compute_logprobs(ModelInput.from_ints(prompt + seq.tokens)).result()
        if scored[0] is not None:
            results.append(Result("sample/first prompt logprob is None", "wrong", f"got {scored[0]!r}"))
        if seq.logprobs is None:
            return results + [Result("sample/sampled vs scored logprobs", "error", "sampled sequences carry no logprobs")]
        tail = scored[len(prompt):]
        worst = max([worst] + [abs(a - b) for a, b in zip(seq.logprobs, tail)])
    results.append(Result("sample/sampled vs scored logprobs", "pass" if worst <= LOGPROB_TOLERANCE else "wrong", f"max |diff| {worst:.1e} nats"))
    if seeded:
        again = sampler.sample(ModelInput.from_ints(prompt), num_samples=2, sampling_params=params).result()
        same = [s.tokens for s in again.sequences] == [s.tokens for s in response.sequences]
        results.append(Result("sample/a seed repeats its sample", "pass" if same else "wrong", "same tokens" if same else "different tokens"))
    return results


def check_temperature(ctx: Context) -> List[Result]:
    """Samples at :data:`SAMPLE_TEMPERATURE` carry logprobs under ``softmax(z / T)``: (1) for two
    tokens drawn at one context, their sampled logprobs differ by ``1/T`` times their temperature-1
    scores' difference (``compute_logprobs``; every engine); (2) where the trainer takes the
    per-datum ``temperature`` input, its scoring at ``T`` matches the sampled logprobs as closely as
    its scoring at 1 matches the sampler's (``2 / T`` times that gap, plus the tolerance: an engine
    whose sampler is another program, e.g. vLLM, differs from the trainer by its kernels' noise)."""
    t = SAMPLE_TEMPERATURE
    sampler = ctx.trainer.save_weights_and_get_sampling_client("conformance-temperature")
    prompt = _tokens(ctx.vocab, 6, offset=3)
    params = SamplingParams(max_tokens=6, temperature=t, seed=13 if ctx.trainer.capabilities.per_request_seed else None)
    seqs = [s for s in sampler.sample(ModelInput.from_ints(prompt), num_samples=8, sampling_params=params).result().sequences if s.tokens]
    if not seqs or any(s.logprobs is None for s in seqs):
        return [Result(f"sample/logprobs at temperature {t:g}", "error", "sampled sequences carry no logprobs")]
    pending = [sampler.compute_logprobs(ModelInput.from_ints(prompt + s.tokens)) for s in seqs]  # all in flight at once
    scored = [f.result()[len(prompt):] for f in pending]
    at: Dict[tuple, Dict[int, List[tuple]]] = {}  # context -> token -> [(sampled logprob at T, scored at 1)]
    for seq, lp1 in zip(seqs, scored):
        for i, (token, sampled) in enumerate(zip(seq.tokens, seq.logprobs)):
            at.setdefault(tuple(seq.tokens[:i]), {}).setdefault(token, []).append((sampled, lp1[i]))
    worst, pairs = 0.0, 0
    for drawn in at.values():
        for same in drawn.values():  # one token at one context: one logprob, however often drawn
            worst = max([worst] + [abs(a - same[0][0]) for a, _ in same])
        (ref_t, ref_1), *others = [same[0] for same in drawn.values()]
        worst = max([worst] + [abs((lp_t - ref_t) - (lp_1 - ref_1) / t) for lp_t, lp_1 in others])
        pairs += len(others)
    label = f"sample/logprobs at temperature {t:g} scale by 1/T"
    if pairs == 0:
        return [Result(label, "error", f"the {len(seqs)} samples never drew two tokens at one context: nothing to compare")]
    results = [Result(label, "pass" if worst <= LOGPROB_TOLERANCE else "wrong",
                      f"{pairs} pairs of tokens at one context: max |dlogp_T - dlogp_1/T| {worst:.1e} nats")]
    label = f"sample/logprobs at temperature {t:g} vs the trainer's at {t:g}"
    plain = [sft_datum(prompt + s.tokens, 1) for s in seqs]
    hot = [Datum(model_input=d.model_input, loss_fn_inputs={**d.loss_fn_inputs, "temperature": [t] * d.model_input.length})
           for d in plain]
    try:
        at_t = per_datum_logprobs(ctx.trainer.forward(hot).result())
    except RlkitError as exc:
        return results + [Result(label, "refused", f"the trainer does not score at {t:g}: {str(exc).splitlines()[0][:100]}")]
    at_1 = per_datum_logprobs(ctx.trainer.forward(plain).result())
    start = len(prompt) - 1  # position i predicts token i + 1

    def gap(trainer: Sequence[torch.Tensor], sampler_side: Sequence[Sequence[float]]) -> float:
        return max(abs(a - float(lp[start + i])) for lp, row in zip(trainer, sampler_side) for i, a in enumerate(row))

    gap_t, gap_1 = gap(at_t, [s.logprobs for s in seqs]), gap(at_1, scored)
    allowed = LOGPROB_TOLERANCE + 2.0 * gap_1 / t
    return results + [Result(label, "pass" if gap_t <= allowed else "wrong",
                             f"max |diff| {gap_t:.1e} nats (allowed {allowed:.1e}: at temperature 1 they differ by {gap_1:.1e})")]


def sft_losses(trainer: Any, vocab: int, steps: int = 3) -> List[float]:
    """The parity script's SFT part: ``steps`` cross-entropy steps, the loss after each (scored here)."""
    data = [sft_datum(_tokens(vocab, 16), 4), sft_datum(_tokens(vocab, 12, offset=9), 3)]
    out = []
    for _ in range(steps):
        trainer.forward_backward(data).result()
        trainer.optim_step(AdamParams(learning_rate=5e-3)).result()
        out.append(ce_value(data, trainer_logprobs(trainer, data)))
    return out


def check_parity(ctx: Context, reference: Any) -> List[Result]:
    """The same script, with rlkit's defaults (alpha included), on this engine and on ``reference``
    (the local engine on the same base model): the same losses, or the engine is wrong."""
    started = time.time()
    kwargs = dict(rank=ctx.rank, seed=0)
    here = ctx.service.create_lora_training_client(ctx.base_model, **kwargs)
    there = reference.create_lora_training_client(ctx.base_model, **kwargs)
    try:
        got, want = sft_losses(here, ctx.vocab), sft_losses(there, ctx.vocab)
    finally:
        here.stop()
        there.stop()
    rel = max(abs(g - w) / max(abs(w), 1e-9) for g, w in zip(got, want))
    status = "pass" if rel <= 1e-4 else "wrong"
    detail = f"SFT losses {', '.join(f'{g:.4f}' for g in got)} vs local {', '.join(f'{w:.4f}' for w in want)} (alpha {DEFAULT_LORA_ALPHA}; {time.time() - started:.0f} s)"
    return [Result("parity/same script as the local engine", status, detail)]


def run_suite(service: Any, *, base_model: str = "tiny", rank: int = 4, reference: Any = None,
              progress: Optional[Callable[[str], None]] = None, only: Optional[Sequence[str]] = None) -> List[Result]:
    """Every check against ``service`` (or those whose label starts with one of ``only``:
    ``refusals``, ``cross-entropy``, ``built-in``, ``defaults``, ``weight decay``, ``save/load``,
    ``ordering``, ``sampling``, ``temperature``, ``parity``); ``reference`` (a local service) adds the parity check."""
    say = progress or (lambda message: None)
    say(f"creating a rank-{rank} LoRA training client on {base_model}")
    trainer = service.create_lora_training_client(base_model, rank=rank, seed=0)
    vocab = int(len(trainer.get_tokenizer()))
    ctx = Context(service, trainer, base_model, rank, vocab, say)
    choose_optimizer(ctx)
    results: List[Result] = []
    steps: List[tuple] = [("refusals", lambda: check_refusals(ctx)), ("cross-entropy", lambda: check_cross_entropy(ctx))]
    steps += [(f"built-in {n}", (lambda n=n: [check_builtin(ctx, n)])) for n in BUILTIN_LOSSES if n != "cross_entropy"]
    steps += [("defaults", lambda: check_builtin_defaults(ctx)), ("weight decay", lambda: check_weight_decay(ctx)),
              ("save/load", lambda: check_save_load(ctx)), ("ordering", lambda: check_ordering(ctx)),
              ("sampling", lambda: check_sampling(ctx)), ("temperature", lambda: check_temperature(ctx))]
    if reference is not None:
        steps.append(("parity", lambda: check_parity(ctx, reference)))
    if only:
        steps = [(label, step) for label, step in steps if label.startswith(tuple(only))]
    try:
        for label, step in steps:
            say(f"checking {label}")
            try:
                results.extend(step())
            except RlkitError as exc:
                results.append(Result(label, "error", str(exc).splitlines()[0][:160]))
    finally:
        trainer.stop()
    return results


def failed(results: Sequence[Result]) -> bool:
    return any(r.status in ("wrong", "error") for r in results)


def summary(results: Sequence[Result]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for r in results:
        out[r.status] = out.get(r.status, 0) + 1
    return out


__all__ = ["Result", "run_suite", "failed", "summary", "LINEAR_ADAM", "CLIP", "DEFAULT_CLIP", "NEIGHBOUR", "RATIOS", "SAMPLE_TEMPERATURE"]
