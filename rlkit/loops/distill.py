"""Distillation loops: on-policy (``loop: onpolicy_distill``) and off-policy (``loop: offpolicy_distill``).

Both read problems from a single-turn task (``train.task``, e.g. ``arithmetic`` or ``gsm8k``):
the student sees the task's own prompt; the teacher (:mod:`rlkit.loops.teacher`) — another
base model, a checkpoint, or the student's base model given a different prompt
(``teacher.system_prompt`` / ``teacher.context``) — reads the same problem through its own chat
rendering.

**On-policy distillation** (:func:`train_onpolicy_distill`; Agarwal et al. 2024, GKD,
arXiv:2306.13649; Thinking Machines, "On-policy distillation", 2025). Each step:

1. the student samples ``samples_per_prompt`` completions of ``prompts_per_step`` problems from
   its current weights, keeping its sampler logprobs ``log q``;
2. the teacher scores the student's tokens with ``compute_logprobs`` on its own prompt -> ``log p``;
3. each completion token gets the reverse-KL advantage ``A_t = -kl_coef (log q_t - log p_t)``,
   plus, with ``task_reward_coef > 0``, the task reward's group-centred advantage
   ``task_reward_coef * (r - mean_group r)`` on every token of the completion;
4. :class:`rlkit.losses.ReverseKLDistillation` (importance sampling on those advantages; it runs
   as the native ``importance_sampling`` built-in) with ``aggregation`` (token mean by default),
   then ``optim_step``; the new weights become the student's sampler.

Deviation from GKD: no mixing with teacher-generated sequences (``lambda = 1``) and a one-sample,
per-token estimate of the reverse KL with no discounting of future tokens, as in the Thinking
Machines recipe.

**Off-policy distillation** (:func:`train_offpolicy_distill`; "sequence-level KD", Kim & Rush
2016, arXiv:1606.07947). Each step the teacher samples completions of the problems on its own
prompt (``teacher_temperature``); optionally only the ones the task reward accepts are kept
(``filter_correct``, rejection sampling); the student trains with cross-entropy on them after
its own prompt.

**Evaluation** (both; before the first step, every ``eval_every`` steps, after the last) on the
task's first ``eval.problems`` test problems: the student's greedy accuracy
(``eval/greedy_accuracy``); the per-token reverse KL to the teacher on ``eval.samples`` fresh
student samples per problem at temperature 1 (``eval/reverse_kl``, the Monte-Carlo estimate of
``E_q[log q - log p]``) and their accuracy (``eval/sampled_accuracy``); at the first evaluation
also the teacher's own greedy accuracy on its prompt (``eval/teacher_greedy_accuracy``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from rlkit.config import Aggregation, LoopConfig
from rlkit.data import TokenBatcher
from rlkit.errors import ConfigError
from rlkit.loop_registry import loop
from rlkit.loops.teacher import Teacher, TeacherConfig, open_teacher_sampler, task_prompt_parts
from rlkit.runs import Run
from rlkit.scaffold import LoopSession
from rlkit.types import Datum, ModelInput, SamplingParams, cost_metrics
from rlkit.rl.rank_rollouts import sample_all


@dataclass
class DistillEvalConfig:
    problems: int = 50  # the first N test problems of the task
    samples: int = 2  # student samples per problem for the reverse-KL estimate (0 = skip)
    max_tokens: Optional[int] = None  # null = train.max_tokens


@dataclass
class DistillBase(LoopConfig):
    """What both distillation loops share."""

    task: Dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    prompts_per_step: int = 8
    samples_per_prompt: int = 4
    max_tokens: int = 16
    aggregation: Aggregation = Aggregation.token_mean
    aggregation_constant: Optional[float] = None
    transcripts: int = 2  # problems written to transcripts/ per step (0 = none)
    eval: DistillEvalConfig = field(default_factory=DistillEvalConfig)


@dataclass
class OnPolicyDistillConfig(DistillBase):
    """On-policy distillation with per-token reverse-KL advantages."""

    temperature: float = 1.0  # student sampling temperature (sent to the trainer when != 1)
    kl_coef: float = 1.0
    task_reward_coef: float = 0.0  # > 0 mixes the task reward's group-centred advantage in

    def scoring_temperature(self) -> float:
        """The student's sampling temperature: the trainer scores its samples at it."""
        return float(self.temperature)

    def temperature_fix(self, engine: str) -> str:
        return f"on-policy distillation on {engine} samples at train.temperature=1.0"


@dataclass
class OffPolicyDistillConfig(DistillBase):
    """Off-policy distillation: cross-entropy on the teacher's samples."""

    teacher_temperature: float = 1.0
    filter_correct: bool = False  # keep only samples the task reward scores >= 1


def distill_datum(prompt: Sequence[int], completion: Sequence[int], sampler_logprobs: Sequence[float],
                  teacher_logprobs: Sequence[float], task_advantage: Optional[float] = None,
                  temperature: Optional[float] = None) -> Datum:
    """A ReverseKLDistillation datum: position ``j-1`` carries completion token ``j``'s weight (1),
    the student's sampler logprob, the teacher's logprob and the optional task advantage."""
    prompt, completion = list(prompt), list(completion)
    if len(sampler_logprobs) != len(completion) or len(teacher_logprobs) != len(completion):
        raise ConfigError(f"distill: {len(completion)} completion tokens but {len(sampler_logprobs)} student / {len(teacher_logprobs)} teacher logprobs")
    tokens = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    inputs: Dict[str, Any] = {
        "target_tokens": tokens[1:] + [0],
        "weights": pad + [1.0] * len(completion) + [0.0],
        "logprobs": pad + [float(x) for x in sampler_logprobs] + [0.0],
        "teacher_logprobs": pad + [float(x) for x in teacher_logprobs] + [0.0],
    }
    if task_advantage is not None:
        inputs["advantages"] = pad + [float(task_advantage)] * len(completion) + [0.0]
    if temperature is not None and temperature != 1.0:
        inputs["temperature"] = [float(temperature)] * len(tokens)
    return Datum(model_input=ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def sft_datum(prompt: Sequence[int], completion: Sequence[int]) -> Datum:
    """A cross-entropy datum training on the completion after the prompt."""
    tokens = list(prompt) + list(completion)
    pad = [0.0] * (len(prompt) - 1)
    return Datum(model_input=ModelInput.from_ints(tokens),
                 loss_fn_inputs={"target_tokens": tokens[1:] + [0], "weights": pad + [1.0] * len(completion) + [0.0]})


class Distillation:
    """What both loops share: task, problems, teacher, prompts, data order, evaluation.

    Built (and its config checked) before the run directory is written; :meth:`open` then takes
    the teacher and the student's training client from a :class:`~rlkit.scaffold.LoopSession`."""

    def __init__(self, cfg: Any, run: Run, t: DistillBase):
        from omegaconf import OmegaConf

        from rlkit.tasks import build_task

        if t.steps is None or t.steps < 1:
            raise ConfigError("train.steps must be a positive integer for the distillation loops")
        if t.prompts_per_step < 1 or t.samples_per_prompt < 1:
            raise ConfigError("train.prompts_per_step and train.samples_per_prompt must be >= 1")
        teacher_cfg = t.teacher
        if not (teacher_cfg.checkpoint or teacher_cfg.base_model or teacher_cfg.system_prompt or teacher_cfg.context):
            raise ConfigError("train.teacher: no teacher given (it would be the student itself); set train.teacher.checkpoint, "
                              "train.teacher.base_model, or a prompt the student does not see (train.teacher.system_prompt / context)")
        self.cfg, self.run, self.t = cfg, run, t
        spec = OmegaConf.to_container(cfg.train.task, resolve=True) if OmegaConf.is_config(cfg.train.task) else dict(t.task)
        self.task = build_task(spec)
        self.train_problems = self.task.problems("train")
        self.test_problems = self.task.problems("test")[: t.eval.problems] if t.eval.problems else []
        self._prompts: Dict[int, tuple] = {}
        self.batcher = TokenBatcher(len(self.train_problems), lambda i: 1, t.prompts_per_step, seed=cfg.seed)

    def open(self, session: LoopSession) -> Any:
        """The teacher (a bad id fails before the student loads), then the student's training
        client; the resumed data order and RNG. Returns the trainer."""
        self.session = session
        session.defer(self.task.close)
        teacher_sampler = open_teacher_sampler(session.service, self.t.teacher, self.cfg.model.base_model)
        self.trainer = session.open_trainer()  # resumed, train.init_checkpoint's weights, or fresh
        self.tokenizer = self.trainer.get_tokenizer()
        self.teacher = Teacher(teacher_sampler, self.tokenizer, self.t.teacher)
        session.restore(data=self.batcher)
        return self.trainer

    def prompts(self, problem: Any) -> tuple:
        """``(student prompt, teacher prompt)`` token ids of a problem."""
        key = id(problem)
        if key not in self._prompts:
            student, messages, prefill_ids, prefill_text = task_prompt_parts(self.task, problem, self.tokenizer)
            if self.teacher.sees_student_prompt:
                teacher = student
            elif messages is None:
                raise ConfigError("the task has no messages(), so only a teacher with the student's tokenizer, template and no context can read it")
            else:
                teacher = self.teacher.prompt(messages, prefill_ids, prefill_text)
            self._prompts[key] = (student, teacher)
        return self._prompts[key]

    def reward(self, completion: Sequence[int], problem: Any, tokenizer: Any = None) -> float:
        from rlkit.rewards.base import as_result

        text = (tokenizer or self.tokenizer).decode(list(completion), skip_special_tokens=True)
        return float(as_result(self.task.reward(text, problem)).reward)

    def due(self, done: int) -> bool:
        """An evaluation is due (the scaffold's cadence) and there are test problems to run it on."""
        return bool(self.test_problems) and self.session.eval_due(done)

    def evaluate(self, done: int, sampler: Any) -> Dict[str, float]:
        """Student greedy accuracy, reverse KL to the teacher on fresh student samples, and (at
        step 0) the teacher's own greedy accuracy."""
        from rlkit.rl.collect import RolloutPolicy, collect_groups
        from rlkit.rl.env import SingleTurnEnvGroup
        from rlkit.rl.eval import evaluate

        t0 = time.perf_counter()
        problems, max_tokens = self.test_problems, self.t.eval.max_tokens or self.t.max_tokens
        out = {k: v for k, v in evaluate(sampler, self.task, problems, self.tokenizer, max_tokens=max_tokens, seed=self.cfg.seed).items() if k != "eval/problems"}
        if done == 0:
            groups = [SingleTurnEnvGroup(self.prompts(p)[1], p, self.task.reward, self.teacher.tokenizer) for p in problems]
            greedy = collect_groups(self.teacher.sampler, groups, 1, SamplingParams(max_tokens=max_tokens, temperature=0.0), RolloutPolicy())
            out["eval/teacher_greedy_accuracy"] = sum(g.rewards[0] >= 1.0 for g in greedy) / len(greedy)
        if self.t.eval.samples:
            params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=self.cfg.seed + 7)
            futures = [sampler.sample(ModelInput.from_ints(self.prompts(p)[0]), self.t.eval.samples, params) for p in problems]
            kl_sum, tokens, seq_kls, rewards = 0.0, 0, [], []
            samples = [(p, seq) for p, f in zip(problems, futures) for seq in f.result().sequences]
            scores = [self.teacher.score(self.prompts(p)[1], seq.tokens, f"eval problem {i}") for i, (p, seq) in enumerate(samples)]
            for (p, seq), score in zip(samples, scores):
                kl = [q - lp for q, lp in zip(seq.logprobs, score.result())]
                kl_sum, tokens = kl_sum + sum(kl), tokens + len(kl)
                seq_kls.append(sum(kl))
                rewards.append(self.reward(seq.tokens, p))
            out["eval/reverse_kl"] = kl_sum / max(tokens, 1)
            out["eval/reverse_kl_seq"] = sum(seq_kls) / max(len(seq_kls), 1)
            out["eval/sampled_accuracy"] = sum(r >= 1.0 for r in rewards) / max(len(rewards), 1)
        out["time/eval_s"] = time.perf_counter() - t0
        return out

    def transcript(self, step: int, rows: List[Dict[str, Any]]) -> None:
        if rows:
            self.run.write_transcript(step, rows)


@loop("onpolicy_distill", schema=OnPolicyDistillConfig, objective="eval/reverse_kl", direction="minimize")
def train_onpolicy_distill(cfg: Any, run: Run) -> Dict[str, Any]:
    """On-policy distillation; see the module docstring."""
    from omegaconf import OmegaConf

    from rlkit.losses import ReverseKLDistillation, run_loss
    from rlkit.rl.advantages import compute_advantages

    t: OnPolicyDistillConfig = OmegaConf.to_object(cfg.train)
    s = Distillation(cfg, run, t)
    loss = ReverseKLDistillation(kl_coef=t.kl_coef)
    with LoopSession(run) as session:
        trainer = s.open(session)
        teacher, total = s.teacher, t.steps
        params = SamplingParams(max_tokens=t.max_tokens, temperature=t.temperature)
        sampler = trainer.save_weights_and_get_sampling_client(f"{run.dir.name} student at step {session.start_step}")
        for step in session.begin(t, total, title=f"onpolicy_distill {cfg.get('recipe')}"):
            t_step = time.perf_counter()
            metrics: Dict[str, Any] = s.evaluate(step, sampler) if s.due(step) else {}
            problems = [s.train_problems[i] for i in s.batcher.next_batch()]

            # 1. the student samples (one request per problem: the prompt is prefilled once)
            t0 = time.perf_counter()
            seed = (cfg.seed * 1_000_003 + step * 10_007) % 2**31
            responses = sample_all(sampler, [(ModelInput.from_ints(s.prompts(p)[0]), t.samples_per_prompt, params.model_copy(update={"seed": seed + k}))
                                             for k, p in enumerate(problems)])  # on N ranks each samples a share
            groups = [(p, r.sequences) for p, r in zip(problems, responses)]
            metrics["time/sample_s"] = time.perf_counter() - t0

            # 2. the teacher scores the student's tokens on its own prompt
            t0 = time.perf_counter()
            scores = [[teacher.score(s.prompts(p)[1], seq.tokens, f"step {step} problem {k}") for seq in seqs] for k, (p, seqs) in enumerate(groups)]
            teacher_lps = [[sc.result() for sc in row] for row in scores]
            metrics["time/teacher_s"] = time.perf_counter() - t0

            # 3. per-token reverse-KL advantages (+ the task reward's group-centred advantage)
            datums, kls, rewards, rows = [], [], [], []
            for (p, seqs), lps in zip(groups, teacher_lps):
                group_rewards = [s.reward(seq.tokens, p) for seq in seqs]
                rewards += group_rewards
                task_adv = [t.task_reward_coef * a for a in compute_advantages(group_rewards, "dr_grpo")] if t.task_reward_coef else [None] * len(seqs)
                for seq, lp, adv, r in zip(seqs, lps, task_adv, group_rewards):
                    if not seq.tokens:
                        continue
                    kls += [q - x for q, x in zip(seq.logprobs, lp)]
                    datums.append(distill_datum(s.prompts(p)[0], seq.tokens, seq.logprobs, lp, adv, t.temperature))
                    if len(rows) < t.transcripts * t.samples_per_prompt:
                        rows.append({"problem": {k: v for k, v in p.items() if isinstance(v, (str, int, float))}, "completion": s.tokenizer.decode(seq.tokens),
                                     "reward": r, "reverse_kl": sum(q - x for q, x in zip(seq.logprobs, lp))})

            # 4. train: the loss (native importance_sampling) and the optimizer step, back to back
            t0 = time.perf_counter()
            lr = t.learning_rate_at(step, total)
            if not datums:
                raise ConfigError(f"step {step}: every student completion was empty; raise train.max_tokens")
            fb = run_loss(trainer, datums, loss, aggregation=t.aggregation.value, constant=t.aggregation_constant)
            opt = trainer.optim_step(t.adam_params(lr))
            out, opt_out = fb.result(), opt.result()
            metrics["time/train_s"] = time.perf_counter() - t0
            sampler = trainer.save_weights_and_get_sampling_client(f"{run.dir.name} student at step {step + 1}")
            metrics.update({
                "train/reverse_kl": sum(kls) / max(len(kls), 1),
                "train/loss": out.metrics.get("loss:sum", float("nan")),
                "reward/mean": sum(rewards) / max(len(rewards), 1),
                "train/completion_tokens": float(len(kls)),
                "train/sequences": float(len(datums)),
                "train/lr": lr,
                "train/grad_norm": opt_out.metrics.get("grad_norm", float("nan")),
                "teacher/calls": float(teacher.calls),
                "time/step_s": time.perf_counter() - t_step,
                **{f"train/{k}": v for k, v in cost_metrics(out.metrics).items()},
            })
            s.transcript(step, rows)
            session.end_step(step, metrics, session.checkpoint(step + 1, data=s.batcher))
        return session.finish(lambda: s.evaluate(total, sampler) if s.due(total) else {}, plot_keys=("train/reverse_kl", "eval/reverse_kl", "eval/greedy_accuracy", "reward/mean", "train/grad_norm"))


@loop("offpolicy_distill", schema=OffPolicyDistillConfig, objective="eval/reverse_kl", direction="minimize")
def train_offpolicy_distill(cfg: Any, run: Run) -> Dict[str, Any]:
    """Off-policy distillation (cross-entropy on the teacher's samples); see the module docstring."""
    from omegaconf import OmegaConf

    from rlkit.losses import CrossEntropy, run_loss, weighted_nll
    from rlkit.losses.execute import nll_needs_logprobs

    t: OffPolicyDistillConfig = OmegaConf.to_object(cfg.train)
    s = Distillation(cfg, run, t)
    with LoopSession(run) as session:
        trainer = s.open(session)
        teacher, total = s.teacher, t.steps
        params = SamplingParams(max_tokens=t.max_tokens, temperature=t.teacher_temperature)

        def student(done: int) -> Any:
            return trainer.save_weights_and_get_sampling_client(f"{run.dir.name} student at step {done}")

        for step in session.begin(t, total, title=f"offpolicy_distill {cfg.get('recipe')}"):
            t_step = time.perf_counter()
            metrics: Dict[str, Any] = {}
            if s.due(step):
                metrics.update(s.evaluate(step, student(step)))
            problems = [s.train_problems[i] for i in s.batcher.next_batch()]

            # 1. the teacher samples on its own prompt; its completions become student tokens
            t0 = time.perf_counter()
            seed = (cfg.seed * 1_000_003 + step * 10_007) % 2**31
            responses = sample_all(teacher.sampler, [(ModelInput.from_ints(s.prompts(p)[1]), t.samples_per_prompt, params.model_copy(update={"seed": seed + k}))
                                                     for k, p in enumerate(problems)])  # on N ranks each samples a share
            pairs, rewards, rows = [], [], []
            for k, (p, response) in enumerate(zip(problems, responses)):
                for seq in response.sequences:
                    completion = teacher.to_student(seq.tokens, f"step {step} problem {k}")
                    r = s.reward(seq.tokens, p, teacher.tokenizer)
                    rewards.append(r)
                    if completion and (r >= 1.0 or not t.filter_correct):
                        pairs.append((s.prompts(p)[0], completion))
                    if len(rows) < t.transcripts * t.samples_per_prompt:
                        rows.append({"problem": {k2: v for k2, v in p.items() if isinstance(v, (str, int, float))},
                                     "completion": teacher.tokenizer.decode(seq.tokens), "reward": r})
            metrics["time/sample_s"] = time.perf_counter() - t0

            # 2. cross-entropy on them (aggregation compiled into the weights), then the optimizer step
            t0 = time.perf_counter()
            lr = t.learning_rate_at(step, total)
            metrics.update({"teacher/reward_mean": sum(rewards) / max(len(rewards), 1), "train/sequences": float(len(pairs)), "train/lr": lr})
            if pairs:
                batch = [sft_datum(pr, c) for pr, c in pairs]
                fb = run_loss(trainer, batch, CrossEntropy(), aggregation=t.aggregation.value, constant=t.aggregation_constant,
                              logprobs=nll_needs_logprobs(t.aggregation.value))
                opt = trainer.optim_step(t.adam_params(lr))
                out, opt_out = fb.result(), opt.result()
                n = sum(len(c) for _, c in pairs)
                nll = weighted_nll(out, batch, t.aggregation.value, t.aggregation_constant)  # weights: 1 on the completion
                metrics.update({"train/nll": nll / max(n, 1), "train/loss": out.metrics.get("loss:sum", float("nan")),
                                "train/completion_tokens": float(n), "train/grad_norm": opt_out.metrics.get("grad_norm", float("nan")),
                                **{f"train/{k}": v for k, v in cost_metrics(out.metrics).items()}})
            else:
                metrics["train/skipped"] = 1.0
            metrics["time/train_s"] = time.perf_counter() - t0
            metrics["time/step_s"] = time.perf_counter() - t_step
            s.transcript(step, rows)
            session.end_step(step, metrics, session.checkpoint(step + 1, data=s.batcher))
        return session.finish(lambda: s.evaluate(total, student(total)) if s.due(total) else {}, plot_keys=("train/nll", "eval/reverse_kl", "eval/greedy_accuracy", "teacher/reward_mean"))
