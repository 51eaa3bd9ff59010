"""The DPO loop (``loop: dpo``): direct preference optimisation on (prompt, chosen, rejected) pairs.

1. **Pairs.** Records become ``(prompt, chosen, rejected)`` (fields, or a transform such as
   :func:`rlkit.loops.pairs.gsm8k_preference_pair`), checked when the data loads — an empty
   response or a chosen equal to its rejected is refused with its file and line before any model
   loads — and rendered through the tokenizer's own chat template (:mod:`rlkit.loops.pairs`).
2. **The frozen reference.** A sampling client on the reference — the policy's starting weights
   by default (the base model, or ``train.init_checkpoint``), or any checkpoint named by
   ``train.reference`` — scores both sides of every pair with ``compute_logprobs`` **once**; the
   values are cached by pair and reused in every epoch and evaluation (:class:`ReferenceCache`).
3. **The loss.** :class:`rlkit.losses.DPO` (``variant: ipo`` for IPO) couples the two datums of a
   pair, so it runs through the linearised path of :func:`rlkit.losses.run_loss` on any backend
   (one ``forward``, the loss and its gradient here, one weighted cross-entropy backward).
   ``aggregation: seq_mean`` (default) averages over pairs, like TRL; ``sum`` sums them.
4. **Evaluation** before the first step, every ``eval_every`` steps and after the last: the DPO
   loss and metrics on the held-out pairs (``forward`` only), and — with ``generate.examples`` —
   greedy answers to the held-out prompts scored by ``generate.reward``.
5. **Checkpoints and resume** like every loop (:mod:`rlkit.runs`): data order and RNG state in
   ``loop_state``; a resumed run re-scores the reference for the pairs it still needs.

Steps run one after the other (unlike the SFT loop's pipelining): the linearised loss needs the
forward pass's logprobs before its backward can be sent, so there is little to overlap.

Metrics per step: ``train/loss``, ``train/accuracy`` (fraction of pairs whose implicit reward
``beta * (log pi/pi_ref)`` ranks chosen above rejected), ``train/reward_margin``,
``train/chosen_reward``, ``train/rejected_reward``, ``train/pairs``, ``train/tokens``,
``train/lr``, ``train/grad_norm``, ``train/epoch``, ``reference/calls`` (``compute_logprobs``
calls so far), ``time/*``. At evaluations the same under ``eval/`` (``eval/preference_accuracy``),
``eval/logp_accuracy`` (the policy's own log-likelihood ranks chosen higher, no reference), and
``eval/answer_accuracy`` when sampling.

Deviation from the paper (Rafailov et al. 2023): no SFT phase is run here; start from one with
``train.init_checkpoint`` (the reference then defaults to it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence

from rlkit.config import GenerationEvalConfig, LoopConfig, instantiate_config
from rlkit.data import TokenBatcher, load_records
from rlkit.errors import ConfigError, DataError, RlkitError
from rlkit.loop_registry import loop
from rlkit.loops.pairs import PairSet, load_pairs, pair_builder, pair_datum
from rlkit.losses.dpo import DPO
from rlkit.runs import Run
from rlkit.scaffold import LoopSession


#: ``train.variant``: the objectives :class:`rlkit.losses.DPO` declares (``DPO.variants``: dpo, ipo)
DPOVariant = Enum("DPOVariant", {v: v for v in DPO.variants}, type=str, module=__name__)  # type: ignore[misc]


class PairAggregation(str, Enum):
    seq_mean = "seq_mean"  # mean over pairs
    sum = "sum"  # sum over pairs


@dataclass
class PairFormatConfig:
    """How a record becomes a preference pair (see :func:`rlkit.loops.pairs.pair_builder`)."""

    prompt_field: str = "prompt"  # a string (the user turn) or a list of messages
    chosen_field: str = "chosen"  # a string (the assistant turn) or a list of messages
    rejected_field: str = "rejected"
    system_prompt: Optional[str] = None
    transform: Optional[str] = None  # "module:function" record -> {prompt, chosen, rejected}
    max_length: int = 1024  # tokens per side (prompt included), truncated on the right


@dataclass
class DPOConfig(LoopConfig):
    """Direct preference optimisation (``rlkit.loops.dpo.train_dpo``)."""

    beta: float = 0.1
    variant: DPOVariant = DPOVariant.dpo
    epochs: int = 1  # used when ``steps`` is null
    pairs_per_step: int = 8
    aggregation: PairAggregation = PairAggregation.seq_mean
    shuffle: bool = True
    reference: Optional[str] = None  # checkpoint id of the frozen reference; null = the policy's start
    eval_pairs_per_forward: int = 16
    format: PairFormatConfig = field(default_factory=PairFormatConfig)
    generate: GenerationEvalConfig = field(default_factory=GenerationEvalConfig)
    generate_at_start: bool = True  # false: skip sampling before the first step (the base model's answers do not depend on the seed)


class ReferenceCache:
    """Reference logprobs of every pair, computed once by a sampling client and reused.

    ``get(key, tokens)`` returns ``compute_logprobs(tokens)`` for a sequence, scoring it only the
    first time; ``prefetch`` submits a batch of sequences at once so the sampler can overlap them.
    ``calls`` counts ``compute_logprobs`` requests (each sequence exactly once per run)."""

    def __init__(self, sampler: Any):
        self.sampler = sampler
        self.calls = 0
        self.seconds = 0.0
        self._values: Dict[Any, Any] = {}

    def prefetch(self, items: Sequence[tuple]) -> None:
        for key, tokens in items:
            if key not in self._values:
                self.calls += 1
                self._values[key] = self.sampler.compute_logprobs(list(tokens))

    def get(self, key: Any, tokens: Sequence[int]) -> List[Optional[float]]:
        self.prefetch([(key, tokens)])
        value = self._values[key]
        if not isinstance(value, list):
            t0 = time.perf_counter()
            value = self._values[key] = list(value.result())
            self.seconds += time.perf_counter() - t0
        return value


def pair_datums(pairs: PairSet, indices: Sequence[int], reference: ReferenceCache, split: str) -> List[Any]:
    """The DPO batch of ``indices``: datum ``2k`` chosen, ``2k+1`` rejected, with reference logprobs."""
    sides = [(i, side, pairs.get(i)[side]) for i in indices for side in (0, 1)]
    reference.prefetch([((split, i, side), tokens) for i, side, (tokens, _) in sides])
    return [pair_datum(tokens, weights, reference.get((split, i, side), tokens)) for i, side, (tokens, weights) in sides]


def open_reference(service: Any, t: DPOConfig) -> Optional[Any]:
    """The frozen reference's sampling client when it is a checkpoint (``None`` = the policy's
    base model); a checkpoint id that does not exist is a one-line error naming it."""
    checkpoint = t.reference or t.init_checkpoint
    if not checkpoint:
        return None
    key = "train.reference" if t.reference else "train.init_checkpoint"
    try:
        return service.create_sampling_client(model_package_arn=checkpoint)
    except RlkitError as exc:
        raise ConfigError(f"{key}={checkpoint!r}: {exc}") from None


def check_same_tokenizer(reference: Any, tokenizer: Any, what: str) -> None:
    theirs = reference.get_tokenizer()
    if theirs is not tokenizer and theirs.get_vocab() != tokenizer.get_vocab():
        raise ConfigError(f"{what}: its tokenizer differs from the policy's; a DPO reference must score the policy's own tokens")


def dpo_metrics(prefix: str, metrics: Dict[str, float]) -> Dict[str, float]:
    """The DPO loss's metrics under readable names."""
    names = {"loss:sum": "loss", "dpo/accuracy:mean": "accuracy", "dpo/reward_margin:mean": "reward_margin",
             "dpo/chosen_reward:mean": "chosen_reward", "dpo/rejected_reward:mean": "rejected_reward"}
    return {f"{prefix}/{names[k]}": float(v) for k, v in metrics.items() if k in names}


class DPOSteps:
    """One DPO run's steps and evaluations, over its trainer, frozen reference and pairs."""

    def __init__(self, t: DPOConfig, run: Run, session: LoopSession, trainer: Any, loss: DPO, reference: ReferenceCache,
                 train_set: PairSet, eval_set: PairSet, eval_records: Sequence[dict], batcher: TokenBatcher, total: int, reward: Any):
        self.t, self.run, self.session, self.trainer, self.loss, self.reference = t, run, session, trainer, loss, reference
        self.train_set, self.eval_set, self.eval_records, self.batcher, self.total, self.reward = train_set, eval_set, eval_records, batcher, total, reward
        self.start = time.perf_counter()  # the clock of time/elapsed_s

    def train_step(self, step: int) -> Dict[str, Any]:
        """Step ``step``: an evaluation if due, then pairs -> reference logprobs (cached) -> DPO through
        ``run_loss`` -> ``optim_step``; returns the step's metrics."""
        from rlkit.losses import run_loss
        from rlkit.types import cost_metrics

        t, trainer = self.t, self.trainer
        t_step = time.perf_counter()
        metrics: Dict[str, Any] = self.evaluate(step)
        indices = self.batcher.next_batch()
        t_ref = time.perf_counter()
        datums = pair_datums(self.train_set, indices, self.reference, "train")
        metrics["time/reference_s"] = time.perf_counter() - t_ref
        lr = t.learning_rate_at(step, self.total)
        fb = run_loss(trainer, datums, self.loss, aggregation=t.aggregation.value)
        optim = trainer.optim_step(t.adam_params(lr))
        out, opt = fb.result(), optim.result()
        metrics.update(dpo_metrics("train", out.metrics))
        metrics.update({f"train/{k}": v for k, v in cost_metrics(out.metrics).items()})
        metrics.update({
            "train/pairs": len(indices),
            "train/tokens": sum(d.model_input.length for d in datums),
            "train/lr": lr,
            "train/grad_norm": opt.metrics.get("grad_norm", float("nan")),
            "train/epoch": self.batcher.epoch_progress,
            "reference/calls": self.reference.calls,
            "time/step_s": time.perf_counter() - t_step,
            "time/elapsed_s": time.perf_counter() - self.start,
        })
        return metrics

    def evaluate(self, done: int) -> Dict[str, float]:
        """Held-out DPO metrics (forward only) and, when due, greedy answers scored by the reward."""
        t, eval_set = self.t, self.eval_set
        if not (len(eval_set) and self.session.eval_due(done)):
            return {}
        t0 = time.perf_counter()
        out = self.held_out_metrics()
        gen = t.generate
        if gen.examples and ((done == 0 and t.generate_at_start) or done == self.total or (gen.every > 0 and done % gen.every == 0)):
            out.update(self.generate(done))
        out["time/eval_s"] = time.perf_counter() - t0
        return out

    def held_out_metrics(self) -> Dict[str, float]:
        """The DPO loss's metrics on every held-out pair, and how often the policy alone ranks chosen higher."""
        from rlkit.losses.execute import score_loss

        t, eval_set = self.t, self.eval_set
        out: Dict[str, float] = {}
        pairs_seen, sums, logp_wins = 0, {}, 0
        for s in range(0, len(eval_set), t.eval_pairs_per_forward):
            indices = list(range(s, min(s + t.eval_pairs_per_forward, len(eval_set))))
            datums = pair_datums(eval_set, indices, self.reference, "eval")
            scored = score_loss(self.trainer, datums, self.loss).result()
            metrics = scored.metrics
            logprobs = [o["logprobs"].to_torch().float() for o in scored.loss_fn_outputs]
            for k, v in dpo_metrics("eval", metrics).items():
                sums[k] = sums.get(k, 0.0) + (v if k == "eval/loss" else v * len(indices))
            seq = [float((d.loss_fn_inputs["weights"].to_torch() * lp).sum()) for d, lp in zip(datums, logprobs)]
            logp_wins += sum(seq[2 * k] > seq[2 * k + 1] for k in range(len(indices)))
            pairs_seen += len(indices)
        out.update({k: v / pairs_seen for k, v in sums.items()})
        out["eval/preference_accuracy"] = out.pop("eval/accuracy")
        out["eval/logp_accuracy"] = logp_wins / pairs_seen
        out["eval/pairs"] = float(pairs_seen)
        return out

    def generate(self, done: int) -> Dict[str, float]:
        from rlkit.chat import prompt_tokens
        from rlkit.rewards.base import as_result
        from rlkit.types import ModelInput, SamplingParams

        trainer, eval_set, tokenizer = self.trainer, self.eval_set, self.eval_set.tokenizer
        checkpoint = trainer.save_weights_for_sampler(f"{self.run.dir.name} eval at step {done}").result().model_package_arn
        sampler = trainer.create_sampling_client(checkpoint)
        params = SamplingParams(max_tokens=self.t.generate.max_tokens, temperature=0.0)
        chosen = list(range(min(self.t.generate.examples, len(eval_set))))
        futures = [sampler.sample(ModelInput.from_ints(prompt_tokens(tokenizer, eval_set.pairs[i].prompt)), 1, params) for i in chosen]
        rows, rewards = [], []
        for i, future in zip(chosen, futures):
            completion = tokenizer.decode(future.result().sequences[0].tokens, skip_special_tokens=True)
            row = {"index": i, "prompt": eval_set.pairs[i].prompt, "completion": completion}
            if self.reward is not None:
                result = as_result(self.reward(completion, self.eval_records[i]))
                rewards.append(result.reward)
                row.update({"reward": result.reward, **result.info})
            rows.append(row)
        self.run.write_transcript(done, rows)
        return {"eval/answer_accuracy": sum(rewards) / len(rewards)} if rewards else {}

    def final(self) -> Dict[str, Any]:
        """The evaluation after the last step, with the reference's call count."""
        out = self.evaluate(self.total)
        return {**out, "reference/calls": self.reference.calls} if out else {}


@loop("dpo", schema=DPOConfig, objective="eval/loss", direction="minimize")
def train_dpo(cfg: Any, run: Run) -> Dict[str, Any]:
    """DPO; see the module docstring."""
    from omegaconf import OmegaConf

    t: DPOConfig = OmegaConf.to_object(cfg.train)
    if cfg.data is None:
        raise DataError("the dpo loop needs data.train (a path or an hf_id)")
    if t.pairs_per_step < 1:
        raise ConfigError(f"train.pairs_per_step={t.pairs_per_step} must be >= 1")
    loss = DPO(beta=t.beta, variant=t.variant.value)

    # 1. pairs: loaded and checked before any model loads
    _, schema = pair_builder(t.format)
    train_where: List[str] = []
    train_records = load_records(cfg.data.train, schema=schema, name="data.train", locations=train_where)
    train_pairs = load_pairs(train_records, train_where, t.format)
    eval_where: List[str] = []
    eval_records = load_records(cfg.data.eval, schema=schema, name="data.eval", locations=eval_where) if cfg.data.eval else []
    eval_pairs = load_pairs(eval_records, eval_where, t.format)
    reward = instantiate_config(t.generate.reward, "train.generate.reward") if t.generate.examples and t.generate.reward else None

    with LoopSession(run) as session:
        # 2. the frozen reference (a bad checkpoint id fails here, before the policy is built)
        ref_sampler = open_reference(session.service, t)
        trainer = session.open_trainer()  # resumed, train.init_checkpoint's weights, or fresh
        tokenizer = trainer.get_tokenizer()
        if ref_sampler is None:
            ref_sampler = session.service.create_sampling_client(base_model=trainer.base_model)
        else:
            check_same_tokenizer(ref_sampler, tokenizer, f"train.reference={t.reference or t.init_checkpoint!r}")
        reference = ReferenceCache(ref_sampler)
        train_set = PairSet(train_pairs, train_where, tokenizer, t.format.max_length)
        eval_set = PairSet(eval_pairs, eval_where, tokenizer, t.format.max_length)
        batcher = TokenBatcher(len(train_set), lambda i: 1, t.pairs_per_step, seed=cfg.seed, shuffle=t.shuffle)
        total = t.steps if t.steps is not None else t.epochs * batcher.batches_per_epoch()
        session.restore(data=batcher)
        steps = DPOSteps(t, run, session, trainer, loss, reference, train_set, eval_set, eval_records, batcher, total, reward)

        # 3. the loop: pairs -> reference logprobs (cached) -> DPO through run_loss -> optim_step
        for step in session.begin(t, total, title=f"dpo {cfg.get('recipe')}"):
            metrics = steps.train_step(step)
            session.end_step(step, metrics, session.checkpoint(step + 1, data=batcher))
        return session.finish(steps.final, plot_keys=("train/loss", "train/accuracy", "train/reward_margin", "eval/preference_accuracy", "eval/loss", "eval/answer_accuracy"))
