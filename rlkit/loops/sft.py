"""Supervised fine-tuning (SFT) on conversations: ``rlkit train recipe=sft_gsm8k``.

One function, :func:`train_sft`, read top to bottom (the bodies of its pipelined steps are
:class:`SFTPipeline`'s):

1. **Data.** Records come from ``cfg.data.train`` / ``cfg.data.eval`` (:mod:`rlkit.data`), become
   chat messages (``train.format``: field names or a ``module:function`` transform) and are rendered
   lazily through the tokenizer's own chat template (:mod:`rlkit.chat`): token ids plus a loss
   weight per token, 1 on the trained turns (assistant turns by default), truncated to
   ``format.max_length``.
2. **Batches by token budget.** :class:`rlkit.data.TokenBatcher` packs shuffled examples until
   ``batch_tokens`` (prompt tokens included) would be exceeded; the order is a function of the seed
   and the epoch, so a checkpoint's ``(epoch, position)`` restores it exactly.
3. **Loss and aggregation.** ``cfg.loss`` (cross-entropy by default; any loss by name or
   ``_target_``, with ``extra_terms``) is built by :func:`rlkit.losses.build_loss` and run by
   :func:`rlkit.losses.run_loss`, like every loop. The session's cross-entropy is a sum over
   tokens; ``token_mean`` (the default) divides each step's weights by its number of trained
   tokens, so steps of different sizes move the weights alike (``sum``, ``seq_mean``,
   ``constant`` also work; DESIGN §3).
4. **Pipelining.** Everything of step *i* — an evaluation ``forward`` if due, ``forward_backward``,
   ``optim_step`` with the scheduled learning rate, a ``save_state`` if due — is *submitted*
   before the results of step *i-1* are awaited and logged, so the session always has the next
   step queued while Python logs, renders and writes files.
5. **Evaluation.** Held-out NLL per trained token with ``forward`` (no gradient) when the
   scaffold says one is due (before the first step, every ``eval_every`` steps, after the last); optionally greedy samples on the first
   ``generate.examples`` eval prompts, scored by ``generate.reward`` (e.g. final-answer accuracy)
   and written to ``transcripts/``.
6. **Checkpoints and resume** every ``checkpoint_every`` steps and at the end, through
   :meth:`rlkit.scaffold.LoopSession.checkpoint` (the cadence) / ``end_step`` with the data order
   and RNG state (see :mod:`rlkit.runs`).

Metrics per step (``metrics.jsonl``): ``train/loss`` (the aggregated loss), ``train/nll`` (mean NLL
per trained token), ``train/tokens``, ``train/trained_tokens``, ``train/sequences``, ``train/lr``,
``train/grad_norm``, ``train/epoch``, ``time/step_s`` (from the previous step's ``optim_step``
completing to this one's: session time, including any evaluation queued in between),
``time/tokens_per_s``, ``time/elapsed_s``; at evaluations
``eval/nll``, ``eval/tokens`` and, when sampling, ``eval/accuracy`` (mean reward) and the reward's
own metrics as ``eval/<name>``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rlkit.chat import prompt_tokens, render_conversation
from rlkit.config import SFTConfig, instantiate_config
from rlkit.data import TokenBatcher, conversation_builder, load_records
from rlkit.errors import DataError
from rlkit.loop_registry import loop
from rlkit.losses import build_loss, run_loss
from rlkit.losses.aggregation import check_aggregation
from rlkit.losses.execute import nll_needs_logprobs, weighted_nll
from rlkit.runs import Run
from rlkit.scaffold import LoopSession
from rlkit.types import Datum, ModelInput, SamplingParams, cost_metrics

TIME_KEYS = ("time/step_s", "time/tokens_per_s", "time/elapsed_s")  # the only nondeterministic metrics


class Examples:
    """Records rendered on first use into ``(tokens, shifted loss weights)`` and cached."""

    def __init__(self, records: Sequence[dict], locations: Sequence[str], tokenizer: Any, to_messages, fmt: Any):
        self.records, self.locations, self.tokenizer, self.to_messages, self.fmt = records, locations, tokenizer, to_messages, fmt
        self._cache: Dict[int, Tuple[List[int], List[float]]] = {}

    def __len__(self) -> int:
        return len(self.records)

    def messages(self, i: int) -> List[dict]:
        try:
            return self.to_messages(self.records[i])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{self.locations[i]}: cannot build a conversation ({exc!r})") from None

    def get(self, i: int) -> Tuple[List[int], List[float]]:
        if i not in self._cache:
            train_on = getattr(self.fmt.train_on, "value", self.fmt.train_on)
            rendered = render_conversation(
                self.tokenizer, self.messages(i), train_on=train_on, max_length=self.fmt.max_length, where=self.locations[i]
            )
            if len(rendered.tokens) < 2:
                raise DataError(f"{self.locations[i]}: the conversation renders to fewer than 2 tokens")
            shifted = list(rendered.weights[1:]) + [0.0]  # weight of position t = weight of token t+1
            self._cache[i] = (rendered.tokens, shifted)
        return self._cache[i]

    def length(self, i: int) -> int:
        return len(self.get(i)[0])


def make_datum(tokens: List[int], weights: List[float]) -> Datum:
    """A cross-entropy datum from tokens and their already shifted weights."""
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": weights})


def _container(node: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def fixed_batches(examples: Examples, budget: int) -> List[List[int]]:
    """Examples in order, packed by token budget (for evaluation)."""
    batches: List[List[int]] = [[]]
    used = 0
    for i in range(len(examples)):
        n = examples.length(i)
        if batches[-1] and used + n > budget:
            batches.append([])
            used = 0
        batches[-1].append(i)
        used += n
    return batches


@dataclass
class Evaluation:
    """Queued evaluation work at one point of the run (``done`` completed steps)."""

    done: int
    forwards: List[Any] = field(default_factory=list)
    weights: Any = None  # save_weights_for_sampler future, when sampling


@dataclass
class Step:
    """Queued work of one training step."""

    step: int
    evaluation: Optional[Evaluation]
    forward_backward: Any
    optim: Any
    masks: List[Any]
    tokens: int
    trained: float
    lr: float
    epoch: float
    checkpoint: Any = None
    done_at: Optional[float] = None  # perf_counter() when its optim_step completed
    batch: List[Any] = field(default_factory=list)  # the datums, for the train NLL


class SFTPipeline:
    """The steps of one SFT run, pipelined: :meth:`submit` queues everything of step *i* (an
    evaluation if due, ``forward_backward``, ``optim_step``, a checkpoint if due) without waiting;
    :meth:`finish` then awaits step *i-1*'s results, logs them and records its checkpoint."""

    def __init__(self, t: SFTConfig, run: Run, session: LoopSession, trainer: Any, train_set: Examples, eval_set: Examples,
                 batcher: TokenBatcher, total: int, loss: Any, reward: Any):
        self.t, self.run, self.session, self.trainer, self.loss, self.reward = t, run, session, trainer, loss, reward
        self.train_set, self.eval_set, self.batcher, self.total = train_set, eval_set, batcher, total
        self.eval_batches = [[make_datum(*eval_set.get(i)) for i in b] for b in fixed_batches(eval_set, t.eval_batch_tokens)] if len(eval_set) else []
        self.last = self.start = time.perf_counter()  # the clock of time/step_s and time/elapsed_s

    # -- evaluation ------------------------------------------------------------------------------

    def evaluation_due(self, done: int) -> Tuple[bool, bool]:
        gen = self.t.generate
        nll = bool(self.eval_batches) and self.session.eval_due(done)
        sample = bool(gen.examples and self.eval_set.records) and (done in (0, self.total) or (gen.every > 0 and done % gen.every == 0))
        return nll, sample

    def submit_evaluation(self, done: int) -> Optional[Evaluation]:
        nll, sample = self.evaluation_due(done)
        if not (nll or sample):
            return None
        ev = Evaluation(done)
        if nll:
            ev.forwards = [self.trainer.forward(batch, "cross_entropy") for batch in self.eval_batches]
        if sample:
            ev.weights = self.trainer.save_weights_for_sampler(f"{self.run.dir.name} eval at step {done}")
        return ev

    def finish_evaluation(self, ev: Optional[Evaluation]) -> Dict[str, float]:
        if ev is None:
            return {}
        metrics: Dict[str, float] = {}
        if ev.forwards:
            outs = [f.result() for f in ev.forwards]
            nll = sum(o.metrics["loss:sum"] for o in outs)
            n = sum(o.metrics["tokens:weighted"] for o in outs)
            metrics.update({"eval/nll": nll / max(n, 1.0), "eval/tokens": n})
        if ev.weights is not None:
            metrics.update(self.sample_and_score(ev))
        return metrics

    def sample_and_score(self, ev: Evaluation) -> Dict[str, float]:
        gen, eval_set, tokenizer = self.t.generate, self.eval_set, self.eval_set.tokenizer
        checkpoint = ev.weights.result().model_package_arn
        sampler = self.trainer.create_sampling_client(checkpoint)
        params = SamplingParams(max_tokens=gen.max_tokens, temperature=0.0)
        chosen = list(range(min(gen.examples, len(eval_set))))
        prompts = [prompt_tokens(tokenizer, eval_set.messages(i)[:-1]) for i in chosen]
        futures = [sampler.sample(ModelInput.from_ints(p), 1, params) for p in prompts]
        rows, rewards, extra = [], [], {}
        for i, future in zip(chosen, futures):
            seq = future.result().sequences[0]
            completion = tokenizer.decode(seq.tokens, skip_special_tokens=True)
            row = {"index": i, "prompt": eval_set.messages(i)[:-1], "completion": completion, "stop_reason": str(getattr(seq.stop_reason, "value", seq.stop_reason))}
            if self.reward is not None:
                from rlkit.rewards.base import as_result

                result = as_result(self.reward(completion, eval_set.records[i]))
                rewards.append(result.reward)
                for k, v in result.metrics.items():
                    extra.setdefault(k, []).append(v)
                row.update({"reward": result.reward, **{k: v for k, v in result.info.items()}})
            rows.append(row)
        self.run.write_transcript(ev.done, rows)
        out: Dict[str, float] = {"eval/samples": float(len(rows))}
        if rewards:
            out["eval/accuracy"] = sum(rewards) / len(rewards)
            out.update({f"eval/{k}": sum(v) / len(v) for k, v in extra.items() if k != "correct"})
        return out

    # -- training steps --------------------------------------------------------------------------

    def submit(self, step: int) -> Step:
        """Queue everything of training step ``step``; nothing here waits."""
        import torch

        t, trainer = self.t, self.trainer
        evaluation = self.submit_evaluation(step)
        indices = self.batcher.next_batch()
        pairs = [self.train_set.get(i) for i in indices]
        trained = sum(sum(1 for x in w if x) for _, w in pairs)
        batch = [make_datum(tokens, weights) for tokens, weights in pairs]
        lr = t.learning_rate_at(step, self.total)
        fb = run_loss(trainer, batch, self.loss, aggregation=t.aggregation.value, constant=t.aggregation_constant,
                      logprobs=nll_needs_logprobs(t.aggregation.value))
        optim = trainer.optim_step(t.adam_params(lr))
        item = Step(step, evaluation, fb, optim, [torch.tensor(w) for _, w in pairs],
                    sum(len(tok) for tok, _ in pairs), trained, lr, self.batcher.epoch_progress, batch=batch)
        optim.add_done_callback(lambda _f, item=item: setattr(item, "done_at", time.perf_counter()))  # session finished it
        item.checkpoint = self.session.checkpoint(step + 1, data=self.batcher)  # when due
        return item

    def finish(self, item: Step) -> Dict[str, Any]:
        """Wait for one step's results, log them, then record its checkpoint."""
        t = self.t
        metrics: Dict[str, Any] = self.finish_evaluation(item.evaluation)
        out = item.forward_backward.result()
        optim = item.optim.result()
        # from the trainer's logprobs, or each datum's loss where the service returns no logprobs
        nll = weighted_nll(out, item.batch, t.aggregation.value, t.aggregation_constant)
        done_at = item.done_at or time.perf_counter()
        seconds, self.last = done_at - self.last, done_at  # session time of this step (+ evals queued before it)
        metrics.update({
            "train/loss": out.metrics.get("loss:sum", float("nan")),
            "train/nll": nll / max(item.trained, 1e-9),
            "train/tokens": item.tokens,
            "train/trained_tokens": item.trained,
            "train/sequences": len(item.masks),
            "train/lr": item.lr,
            "train/grad_norm": optim.metrics.get("grad_norm", float("nan")),
            "train/epoch": item.epoch,
            "time/step_s": seconds,
            "time/tokens_per_s": item.tokens / seconds if seconds > 0 else 0.0,
            "time/elapsed_s": done_at - self.start,
            **{f"train/{k}": v for k, v in cost_metrics(out.metrics).items()},
        })
        self.session.end_step(item.step, metrics, item.checkpoint)
        return metrics


@loop("sft", schema=SFTConfig, objective="eval/nll", direction="minimize")
def train_sft(cfg: Any, run: Run) -> Dict[str, Any]:
    """Supervised fine-tuning; see the module docstring."""
    from omegaconf import OmegaConf

    t: SFTConfig = OmegaConf.to_object(cfg.train)
    if cfg.data is None:
        raise DataError("the sft loop needs data.train (a path or an hf_id)")

    # 1. data: records now (bad files and settings fail before any model loads), rendering on first use
    to_messages, schema = conversation_builder(t.format)
    train_where: List[str] = []
    train_records = load_records(cfg.data.train, schema=schema, name="data.train", locations=train_where)
    eval_where: List[str] = []
    eval_records = load_records(cfg.data.eval, schema=schema, name="data.eval", locations=eval_where) if cfg.data.eval else []
    check_aggregation(t.aggregation.value, t.aggregation_constant)
    loss = build_loss(_container(cfg.loss) if cfg.loss is not None else "cross_entropy")
    gen = t.generate
    reward = instantiate_config(gen.reward, "train.generate.reward") if gen.examples and gen.reward is not None else None

    with LoopSession(run) as session:
        trainer = session.open_trainer()
        tokenizer = trainer.get_tokenizer()
        train_set = Examples(train_records, train_where, tokenizer, to_messages, t.format)
        eval_set = Examples(eval_records, eval_where, tokenizer, to_messages, t.format)
        batcher = TokenBatcher(len(train_set), train_set.length, t.batch_tokens, seed=cfg.seed, shuffle=t.shuffle)
        total = t.steps if t.steps is not None else t.epochs * batcher.batches_per_epoch()
        session.restore(data=batcher)
        pipeline = SFTPipeline(t, run, session, trainer, train_set, eval_set, batcher, total, loss, reward)

        # 2-6. the pipelined loop: submit step i, then finish step i-1
        pending: Optional[Step] = None
        for step in session.begin(t, total):
            queued = pipeline.submit(step)
            if pending is not None:
                pipeline.finish(pending)
            pending = queued
        if pending is not None:
            pipeline.finish(pending)
        return session.finish(lambda: pipeline.finish_evaluation(pipeline.submit_evaluation(total)))
