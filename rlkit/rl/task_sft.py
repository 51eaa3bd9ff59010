"""The SFT baseline of an RL recipe (``loop: task_sft``): same task, model, steps and evaluation,
but the update is cross-entropy on each problem's reference answer instead of a policy gradient.

Each step takes ``groups_per_batch`` problems from the same curriculum, renders the task's prompt
(``task.prompt``) followed by ``task.reference_completion(problem)`` (plus the end-of-turn token), and trains on the
completion tokens (token-mean); a task with multi-turn demonstrations (``task.reference_tokens``,
e.g. ``rlkit.tasks.tools``: tool calls, their results, the answer) trains on its assistant turns.
Evaluation is the RL loop's (greedy accuracy, pass@k), so
``rlkit repro`` compares "SFT on the same problems" with RL on equal terms.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

from rlkit.chat import datum_from_tokens, plain_tokens
from rlkit.curriculum import build_curriculum
from rlkit.errors import ConfigError
from rlkit.losses import CrossEntropy, run_loss
from rlkit.loop_registry import loop
from rlkit.rl.config import RLConfig, TaskSFTConfig
from rlkit.rl.loop import _evaluate
from rlkit.runs import Run
from rlkit.scaffold import LoopSession
from rlkit.tasks import build_task
from rlkit.types import cost_metrics


def reference_tokens(task: Any, problem: Any, tokenizer: Any, end: List[int]) -> Tuple[List[int], List[float]]:
    """Tokens and loss weights of a problem's reference: the task's own ``reference_tokens`` (a
    whole demonstration conversation, e.g. with tool calls), else its prompt followed by
    ``reference_completion`` and the end-of-turn token, trained on the completion."""
    own = task.reference_tokens(problem, tokenizer)
    if own is not None:
        return own
    prompt = task.prompt(problem, tokenizer)
    answer = plain_tokens(tokenizer, task.reference_completion(problem)) + end
    return prompt + answer, [0.0] * len(prompt) + [1.0] * len(answer)


@loop("task_sft", schema=TaskSFTConfig, objective="eval/greedy_accuracy", direction="maximize")
def train_task_sft(cfg: Any, run: Run) -> Dict[str, Any]:
    from omegaconf import OmegaConf

    t: RLConfig = OmegaConf.to_object(cfg.train)
    task = build_task(OmegaConf.to_container(cfg.train.task, resolve=True) if OmegaConf.is_config(cfg.train.task) else t.task)
    if not task.has_references:
        task.close()
        raise ConfigError(f"task {task.name!r} has no reference answers (reference_completion); no SFT baseline for it")
    train_problems = task.problems("train")
    test_problems = task.problems("test")[: t.eval.problems] if t.eval.problems else []
    curriculum = build_curriculum(t.curriculum.name, len(train_problems), seed=cfg.seed, **dict(t.curriculum.options))
    with LoopSession(run) as session:
        session.defer(task.close)  # a code task's sandbox pool
        trainer = session.open_trainer()
        session.restore(curriculum=curriculum)
        tokenizer = trainer.get_tokenizer()
        end = [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)] if tokenizer.eos_token else []
        sampler = trainer.save_weights_and_get_sampling_client()

        def evaluate() -> Dict[str, float]:
            return _evaluate(t, task, test_problems, tokenizer, sampler, cfg.seed, trainer.capabilities.in_flight(t.concurrency, len(test_problems)))

        for step in session.begin(t, t.steps, title=f"task_sft {cfg.get('recipe')}"):
            t0 = time.perf_counter()
            metrics: Dict[str, float] = evaluate() if session.eval_due(step) else {}
            data = []
            for i in curriculum.next_batch(t.groups_per_batch):
                data.append(datum_from_tokens(*reference_tokens(task, train_problems[i], tokenizer, end)))
            out = run_loss(trainer, data, CrossEntropy(), aggregation="token_mean").result()
            opt = trainer.optim_step(t.adam_params(t.learning_rate_at(step, t.steps))).result()
            sampler = trainer.save_weights_and_get_sampling_client()
            metrics.update({"train/nll": out.metrics.get("cross_entropy/nll:mean", 0.0), "train/grad_norm": opt.metrics["grad_norm"],
                            "tokens/trained": float(out.usage.train_tokens), "time/step": time.perf_counter() - t0,
                            **{f"train/{k}": v for k, v in cost_metrics(out.metrics).items()}})
            session.end_step(step, metrics, session.checkpoint(step + 1, curriculum=curriculum))
        return session.finish(evaluate, plot_keys=("train/nll", "eval/greedy_accuracy"))
