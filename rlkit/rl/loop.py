"""The RL loop (``loop: rl``): GRPO-style training, readable top to bottom.

Each step:

1. **choose problems** — the curriculum picks ``groups_per_batch`` problems;
2. **roll out** — each problem's G completions come from one ``sample(num_samples=G)`` call
   (multi-turn envs alternate sampling and ``Env.step``); tokens and sampler logprobs are kept;
3. **score** — rewards per trajectory (or jointly per group), failures handled by the rollout policy;
4. **advantages** — group-relative (GRPO / Dr. GRPO / RLOO); groups with no reward variance carry
   no gradient and are counted (and dropped unless ``drop_zero_variance=false``); with
   ``curriculum.dynamic_sampling`` more problems are drawn to refill the batch (DAPO);
5. **train** — trajectories become datums (sampler logprobs, advantages, and the sampling
   temperature so the trainer scores the same distribution); the loss runs natively or linearised
   (``rlkit.losses.run_loss``) and ``optim_step`` is queued right behind it; the sampler-vs-trainer
   ``mismatch/*`` metrics come on every step where the pass returns the trainer's logprobs anyway
   (local, tinker) and every ``train.mismatch_every`` steps where they cost a scoring (SageMaker);
6. **publish** — the new adapter is saved and the sampler moves to it.

Deviations from the GRPO paper (Shao et al. 2024), all configurable: the default loss is PPO's
clipped surrogate with token-mean aggregation (DAPO) rather than sequence-mean; there is no KL
term unless the loss config adds ``kl_penalty``; one gradient step per batch (no inner PPO
epochs), so the importance ratio only corrects sampler/trainer numerics and staleness.

Schedules: synchronous (``max_staleness=0``), or sampling ahead with a bounded staleness
(``rlkit.rl.schedule``). Evaluation on held-out problems (greedy accuracy, pass@k) runs before
the first step, every ``eval_every`` steps and after the last.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Tuple

from rlkit.cost import preview
from rlkit.curriculum import DynamicSampling, build_curriculum
from rlkit.errors import ConfigError
from rlkit.loop_registry import loop
from rlkit.losses import build_loss, run_loss
from rlkit.losses.execute import has_trainer_logprobs
from rlkit.rl.advantages import compute_advantages
from rlkit.rl.collect import FailedSteps, collect_groups
from rlkit.rl.config import RLConfig
from rlkit.rl.datums import trajectory_datums
from rlkit.rl.eval import evaluate, success
from rlkit.rl.schedule import AsyncSchedule, Batch, SyncSchedule
from rlkit.runs import Run
from rlkit.scaffold import LoopSession
from rlkit.harness.during_training import HarnessEval
from rlkit.tasks.base import build_task
from rlkit.types import SamplingParams

log = logging.getLogger("rlkit.rl")


def group_seed(seed: int, step: int, index: int) -> int:
    return (seed * 1_000_003 + step * 10_007 + index) % 2**31


class Sampling:
    """How one RL run samples: its rollout policy, sampling parameters, per-request seeds and
    concurrency, over the curriculum's problems. :meth:`sample_batch` is what the schedule calls
    for a step's batch; :meth:`evaluate` runs the held-out problems on a sampler."""

    def __init__(self, cfg: Any, t: RLConfig, session: LoopSession, trainer: Any, task: Any, train_problems: List[Any],
                 test_problems: List[Any], curriculum: Any):
        self.cfg, self.t, self.session, self.task, self.curriculum = cfg, t, session, task, curriculum
        self.train_problems, self.test_problems, self.capabilities = train_problems, test_problems, trainer.capabilities
        self.params = SamplingParams(max_tokens=t.max_tokens, temperature=t.temperature, top_p=t.top_p, top_k=t.top_k, stop=list(t.stop) or None)
        self.tokenizer = trainer.get_tokenizer()
        self.seeded = trainer.capabilities.per_request_seed  # vLLM's CPU build cannot take a per-request seed
        if not self.seeded:
            log.warning("%s takes no per-request seeds: rollouts are not reproducible from cfg.seed", trainer.capabilities.engine)
        self.refill = DynamicSampling(t.curriculum.dynamic_sampling, t.curriculum.max_resample_rounds)
        self.in_flight = trainer.capabilities.in_flight(t.concurrency, t.groups_per_batch)  # a polled service: a batch at once
        if self.in_flight != t.concurrency:
            log.info("%s polls each operation: %d groups in flight at once (train.concurrency=%d)", trainer.capabilities.engine, self.in_flight, t.concurrency)

    def sample_batch(self, step: int, sampler: Any, version: int) -> Batch:
        """Draw problems, roll out their groups, and (with dynamic sampling) refill."""
        t, curriculum = self.t, self.curriculum
        t0 = time.perf_counter()
        seen = {"drawn": 0}

        def draw(n: int) -> List[Any]:
            indices = curriculum.next_batch(n)
            env_groups = [self.task.env_group(self.train_problems[i], self.tokenizer) for i in indices]
            seeds = [group_seed(self.cfg.seed, step, seen["drawn"] + k) for k in range(len(indices))]
            seen["drawn"] += len(indices)
            got = collect_groups(sampler, env_groups, t.group_size, self.params, t.rollout, concurrency=self.in_flight, sampler_version=version,
                                 seeds=seeds if self.seeded else None)
            for i, g in zip(indices, got):
                curriculum.update(i, g.rewards)
            return got

        groups, drawn, rounds = self.refill.fill(t.groups_per_batch, draw)
        stats = {"time/rollout": time.perf_counter() - t0, "rollout/problems_drawn": float(drawn), "rollout/resample_rounds": float(rounds)}
        return Batch(groups=groups, version=version, state=self.session.loop_state(curriculum=curriculum), stats=stats)

    def evaluate(self, sampler: Any) -> Dict[str, float]:
        t = self.t
        return _evaluate(t, self.task, self.test_problems, self.tokenizer, sampler, self.cfg.seed if self.seeded else None,
                         self.capabilities.in_flight(t.concurrency, len(self.test_problems)))


@loop("rl", schema=RLConfig, objective="eval/greedy_accuracy", direction="maximize")
def train_rl(cfg: Any, run: Run) -> Dict[str, Any]:
    """GRPO-style RL; see the module docstring."""
    from omegaconf import OmegaConf

    t: RLConfig = OmegaConf.to_object(cfg.train)
    if t.steps is None or t.steps < 1:
        raise ConfigError("train.steps must be a positive integer for the rl loop")
    task = build_task(OmegaConf.to_container(cfg.train.task, resolve=True) if OmegaConf.is_config(cfg.train.task) else t.task)
    train_problems = task.problems("train")
    test_problems = task.problems("test")[: t.eval.problems] if t.eval.problems else []
    loss = build_loss(OmegaConf.to_container(cfg.loss, resolve=True) if cfg.loss is not None else {"name": "ppo"})
    curriculum = build_curriculum(t.curriculum.name, len(train_problems), seed=cfg.seed, **dict(t.curriculum.options))
    harness = HarnessEval(t.eval.harness, t.steps).prepare()  # lm-eval's tasks resolved before any model loads

    with LoopSession(run) as session:
        session.defer(task.close)  # a code task's sandbox pool
        session.defer(harness.close)
        trainer = session.open_trainer()
        task.attach(session.service, trainer.base_model)  # a fixed opponent's sampler (rlkit.tasks.envs.textarena_task)
        if cfg.get("cost_preview") and session.start_step == 0:  # prompts measured with this engine's own tokenizer
            preview(cfg, tokenizer=trainer.get_tokenizer())
        session.restore(curriculum=curriculum)
        reference = session.service.create_sampling_client(base_model=trainer.base_model) if "ref_logprobs" in loss.required_inputs else None
        failed_steps = FailedSteps(t.rollout, t.group_size)  # a run whose rollouts all fail stops with one line
        start, total = session.start_step, t.steps
        sampling = Sampling(cfg, t, session, trainer, task, train_problems, test_problems, curriculum)
        schedule = SyncSchedule(sampling.sample_batch) if t.max_staleness == 0 else AsyncSchedule(sampling.sample_batch, t.max_staleness, t.staleness_policy, start)
        session.defer(schedule.close)
        schedule.publish(trainer.save_weights_and_get_sampling_client(f"{run.dir.name} weights at step {start}"), start)

        for step in session.begin(t, total, title=f"rl {cfg.get('recipe')}"):
            t_step = time.perf_counter()
            metrics: Dict[str, float] = sampling.evaluate(schedule.sampler) if session.eval_due(step) else {}
            metrics.update(harness.at_step(schedule.sampler, step))  # overlapped with the step (train.eval.harness)

            # 1-4: a scored batch, its advantages and datums
            t_wait = time.perf_counter()
            batch = schedule.next(step)
            failed_steps.check(step, batch.groups)
            metrics["time/wait_rollout"] = time.perf_counter() - t_wait  # = time/rollout when synchronous
            metrics.update(batch.stats)
            metrics["rollout/sampler_version"] = float(batch.version)  # the weight version (adapter) the batch was sampled from
            datums, zero_variance = batch_datums(t, batch.groups, reference)
            transcript = _transcript(batch.groups[: t.transcripts], sampling.tokenizer) if t.transcripts else []

            # 5: train (loss and optimizer step queued back to back). The trainer's logprobs are
            # asked for only on mismatch steps (a scoring round trip where the service computes the
            # loss itself); their scoring overlaps the optimizer step and the publish below.
            t_train = time.perf_counter()
            lr = t.learning_rate_at(step, total)
            update = submit_update(trainer, t, loss, step, datums, lr, metrics)
            metrics["time/train"] = time.perf_counter() - t_train

            # 6: new weights reach the sampler
            t_sync = time.perf_counter()
            schedule.publish(trainer.save_weights_and_get_sampling_client(f"{run.dir.name} weights at step {step + 1}"), step + 1)
            metrics["time/sync_weights"] = time.perf_counter() - t_sync
            if update is not None:
                t_out = time.perf_counter()
                metrics.update(update_metrics(datums, *update))
                metrics["time/train"] += time.perf_counter() - t_out

            metrics.update(_rollout_metrics(batch, zero_variance, step))
            metrics["optim/learning_rate"] = lr
            if transcript:
                run.write_transcript(step, transcript)
            # the checkpoint is saved now; end_step records it only after this step's line
            t_ckpt = time.perf_counter()
            pending = session.checkpoint(step + 1, batch.state)
            if pending is not None:
                pending.future.result()
            metrics["time/checkpoint"] = time.perf_counter() - t_ckpt
            metrics.update(harness.wait() if step + 1 == total else {})  # the last background evaluation, in the last line
            session.end_step(step, step_times(metrics, t_step), pending)

        last = session.finish(lambda: {**sampling.evaluate(schedule.sampler), **harness.final(schedule.sampler)},
                              plot_keys=("reward/mean", "eval/greedy_accuracy", "train/loss:sum", "rollout/zero_variance_frac"))
        print_summary(cfg.get("recipe"), run)
        return last


def batch_datums(t: RLConfig, groups: List[Any], reference: Any) -> Tuple[List[Any], int]:
    """The datums of a batch's groups with their group-relative advantages (with ``ref_logprobs``
    when the loss needs them), and how many groups had no reward variance (dropped unless
    ``drop_zero_variance=false``)."""
    datums: List[Any] = []
    zero_variance = 0
    for g in groups:
        advantages = compute_advantages(g.rewards, t.advantage)
        if not g.has_variance:
            zero_variance += 1
            if t.drop_zero_variance:
                continue
        for traj, adv in zip(g.trajectories, advantages):
            datums.extend(trajectory_datums(traj, adv, t.temperature if t.score_with_temperature else None))
    if reference is not None:
        datums = with_reference_logprobs(datums, reference)
    return datums, zero_variance


def submit_update(trainer: Any, t: RLConfig, loss: Any, step: int, datums: List[Any], lr: float, metrics: Dict[str, float]) -> Optional[Tuple[Any, Any]]:
    """Queue the loss on ``datums`` and the optimizer step right behind it; returns the loss's future
    and the optimizer step's result (``None``, the step marked skipped, when there is nothing to train on)."""
    if not datums:
        log.warning("step %d: every group had equal rewards; nothing to train on (skipped)", step)
        metrics["train/skipped"] = 1.0
        return None
    want_mismatch = t.mismatch_every > 0 and step % t.mismatch_every == 0
    fb = run_loss(trainer, datums, loss, aggregation=t.aggregation.value, constant=t.aggregation_constant, logprobs=want_mismatch)
    opt_out = trainer.optim_step(t.adam_params(lr)).result()
    metrics.update(_sampler_metrics(datums))
    return fb, opt_out


def update_metrics(datums: List[Any], fb: Any, opt_out: Any) -> Dict[str, float]:
    """The loss pass's metrics, the gradient norm, the tokens trained, and the sampler-vs-trainer
    mismatch where the pass returned the trainer's logprobs."""
    fb_out = fb.result()
    metrics = {f"train/{k}": v for k, v in fb_out.metrics.items()}
    metrics["train/grad_norm"] = opt_out.metrics.get("grad_norm", 0.0)
    metrics["tokens/trained"] = float(fb_out.usage.train_tokens)
    if has_trainer_logprobs(fb_out, len(datums)):
        metrics.update(_mismatch(datums, fb_out))
    return metrics


def step_times(metrics: Dict[str, float], t_step: float) -> Dict[str, float]:
    """``metrics`` with the step's wall time and what of it no ``time/*`` phase accounts for."""
    metrics["time/step"] = time.perf_counter() - t_step
    accounted = sum(metrics.get(k, 0.0) for k in ("time/wait_rollout", "time/train", "time/sync_weights", "time/checkpoint", "time/eval"))
    metrics["time/loop_overhead"] = max(metrics["time/step"] - accounted, 0.0)
    return metrics


def print_summary(recipe: Any, run: Run) -> None:
    """One line per held-out metric: before the first step -> after the last."""
    evals = [m for m in run.metrics() if "eval/greedy_accuracy" in m]
    if len(evals) < 2:
        return
    first, last = evals[0], evals[-1]
    parts = [f"{k[5:]} {first[k]:.3f} -> {last[k]:.3f}" for k in sorted(last)
             if k.startswith("eval/") and k in first and k != "eval/problems" and not k.startswith("eval/greedy/")]
    print(f"{recipe}: held-out ({int(last.get('eval/problems', 0))} problems) " + ", ".join(parts) + f"; run dir {run.dir}", flush=True)


def _evaluate(t: RLConfig, task: Any, problems: List[Any], tokenizer: Any, sampler: Any, seed: Optional[int], concurrency: int) -> Dict[str, float]:
    if not problems:
        return {}
    t0 = time.perf_counter()
    metrics = evaluate(
        sampler, task, problems, tokenizer,
        max_tokens=t.eval.max_tokens or t.max_tokens, pass_k=t.eval.pass_k, temperature=t.eval.temperature,
        stop=t.stop, seed=seed, policy=t.rollout, concurrency=concurrency,
    )
    metrics["time/eval"] = time.perf_counter() - t0
    return metrics


def with_reference_logprobs(datums: List[Any], reference: Any) -> List[Any]:
    """Each datum with ``ref_logprobs`` from the reference sampler, shifted like every per-token
    input (position i scores token i+1; the last is 0). Every request is submitted before any is
    awaited, so a remote engine answers them together instead of B*G sequential round trips."""
    from rlkit.types import Datum

    futures = [reference.compute_logprobs(d.model_input.to_ints()) for d in datums]
    out = []
    for datum, future in zip(datums, futures):
        ref = future.result()[1:] + [0.0]
        out.append(Datum(model_input=datum.model_input, loss_fn_inputs={**datum.loss_fn_inputs, "ref_logprobs": [float(x) for x in ref]}))
    return out


def _sampler_metrics(datums: List[Any]) -> Dict[str, float]:
    """What the sampler's own logprobs tell, every step (no trainer logprobs needed)."""
    import torch

    q = [d.loss_fn_inputs["logprobs"].to_torch()[d.loss_fn_inputs["weights"].to_torch() != 0] for d in datums]
    q = torch.cat(q) if q else torch.zeros(0)
    return {"policy/entropy_estimate": float(-q.mean())} if q.numel() else {}  # Monte-Carlo: E[-log q] over sampled tokens


def _mismatch(datums: List[Any], output: Any) -> Dict[str, float]:
    """Sampler-vs-trainer logprob mismatch on the trained tokens (before the update): logged on
    the steps whose pass carried the trainer's logprobs (every step locally; every
    ``train.mismatch_every`` steps where they are scored, SageMaker)."""
    import torch

    diffs = []
    for d, out in zip(datums, output.loss_fn_outputs):
        w = d.loss_fn_inputs["weights"].to_torch() != 0
        diffs.append(out["logprobs"].to_torch()[w] - d.loss_fn_inputs["logprobs"].to_torch()[w])
    diff = torch.cat(diffs) if diffs else torch.zeros(0)
    if not diff.numel():
        return {}
    from rlkit.losses.policy import sampler_trainer_kl

    return {
        "mismatch/logprob_diff_abs": float(diff.abs().mean()),
        "mismatch/kl_k3": float(sampler_trainer_kl(diff)),  # KL(q || p), k3: the one definition
    }


def _rollout_metrics(batch: Batch, zero_variance: int, step: int) -> Dict[str, float]:
    groups = batch.groups
    rewards = [r for g in groups for r in g.rewards]
    trajs = [(tr, r) for g in groups for tr, r in zip(g.trajectories, g.rewards)]
    n = max(len(rewards), 1)
    out = {
        "reward/mean": sum(rewards) / n,
        "reward/accuracy": sum(success(tr, r) for tr, r in trajs) / n,
        "rollout/groups": float(len(groups)),
        "rollout/zero_variance_frac": zero_variance / max(len(groups), 1),
        "rollout/failed": float(sum(g.failed for g in groups)),
        "rollout/skipped_groups": float(sum(1 for g in groups if g.skipped)),
        "rollout/staleness": float(step - batch.version),
        "rollout/completion_tokens_mean": sum(tr.num_action_tokens for tr, _ in trajs) / n,
        "rollout/truncated_frac": sum(any(x.stop_reason == "length" for x in tr.transitions) for tr, _ in trajs) / n,
        "tokens/prefill": float(sum(g.prefill_tokens for g in groups)),
        "tokens/sampled": float(sum(g.decode_tokens for g in groups)),
        "time/reward_cpu": sum(g.reward_seconds for g in groups),
    }
    metric_sums: Dict[str, float] = {}
    for tr, _ in trajs:
        for k, v in tr.metrics.items():
            metric_sums[k] = metric_sums.get(k, 0.0) + float(v)
    out.update({f"reward/{k}": v / n for k, v in metric_sums.items() if not k.startswith("tokens/")})
    out.update({k: v for k, v in metric_sums.items() if k.startswith("tokens/")})  # a reward's own tokens (an LLM judge's): summed
    return out


def _transcript(groups: List[Any], tokenizer: Any) -> List[Dict[str, Any]]:
    rows = []
    for g in groups:
        for tr, r in zip(g.trajectories, g.rewards):
            turns = []
            for k, x in enumerate(tr.transitions):
                turn = {"completion": tokenizer.decode(x.action), "reward": x.reward}
                if k:  # what the environment said before this turn (feedback); turn 0's is the prompt
                    turn["observation"] = tokenizer.decode(x.observation)
                turns.append(turn)
            rows.append({
                "problem": {k: v for k, v in g.problem.items() if isinstance(v, (str, int, float))},
                "completion": "".join(t["completion"] for t in turns),
                "turns": turns,
                "reward": r,
                "failed": tr.failure or None,
            })
    return rows

