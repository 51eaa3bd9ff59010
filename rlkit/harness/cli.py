"""``rlkit eval``: lm-evaluation-harness tasks on an rlkit model, checkpoint or run, on any engine.

    rlkit eval model=smollm2-135m-instruct tasks=gsm8k limit=100 precision=fp32
    rlkit eval run=runs/gsm8k_grpo/2026-12-07_10-00-00 tasks=gsm8k,mbpp limit=50
    rlkit eval checkpoint=runs/x/checkpoints/step-30 tasks=gsm8k num_fewshot=0 apply_chat_template=true
    rlkit eval model=tiny tasks=hellaswag backend=tinker base_url=http://127.0.0.1:8000   (any engine)

Writes lm-eval's own files — ``results_<time>.json`` and ``samples_<task>_<time>.jsonl`` — into
``<run>/eval/`` with ``run=``, else into ``output=DIR`` (default ``./rlkit-eval/``), under a folder
named after the model as lm-eval names it, and prints lm-eval's table. Checks, in this order and
before any model loads, each failing in one line with exit code 2: the weights (a checkpoint of
another base model, a run without ``config.yaml``), the task names (lm-eval's nearest names
suggested), a working sandbox for code tasks, and each task's data (rlkit's own copies of GSM8K
and MBPP always; any other task's from the hub or its cache, refused offline when not cached).
See :mod:`rlkit.harness.tasks` and ``docs/evaluation.md``.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from rlkit.errors import BackendUnavailableError, ConfigError
from rlkit.harness.weights import EVAL_KEYS, WEIGHT_KEYS

USAGE = """usage: rlkit eval [model=NAME] [checkpoint=DIR | run=DIR] tasks=T1,T2 [key=value ...]

  model=NAME            base model: smollm2-135m-instruct (default), tiny, a HF directory or hub id
  checkpoint=DIR        a saved checkpoint (LoRA or full fine-tuning; its base model from its metadata)
  run=DIR               a training run: its newest checkpoint; results go to DIR/eval/
  tasks=T1,T2           lm-eval task names or globs (gsm8k, mbpp run offline from rlkit's copies)
  limit=N               the first N items of each task (a fraction 0-1: that share)
  num_fewshot=K         override the tasks' few-shot count
  apply_chat_template=true|NAME   chat-format the prompts (fewshot_as_multiturn=true by default then)
  system_instruction=TEXT, gen_kwargs=k=v,k=v, seed=N, bootstrap_iters=N, include_path=DIR
  output=DIR            where results go without run= (default ./rlkit-eval)
  local_data=false      read GSM8K/MBPP from the hub instead of rlkit's identical copies
  backend=local|tinker|sagemaker   the engine (default local); any other key=value is a model argument:
                        lm-eval's (max_length, max_gen_toks, add_bos_token, ...) or the engine's
                        (precision=fp32|bf16|auto, device=..., max_batch_rows=N, num_threads=N, ...)
  verbose=true          lm-eval's and datasets' own logging and progress bars too

Code tasks (mbpp, humaneval, ...) run every program in rlkit's sandbox (no network, limits)."""


def parse_args(argv: List[str]) -> Dict[str, Any]:
    """``key=value`` arguments, values typed as lm-eval types its model args (true/false, numbers)."""
    from lm_eval.utils import handle_arg_string

    out: Dict[str, Any] = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or not key or arg.startswith("-"):
            raise ConfigError(f"rlkit eval: expected key=value, got {arg!r} (see rlkit eval --help)")
        if key in out:
            raise ConfigError(f"rlkit eval: {key}= given twice")
        out[key] = value if key in ("tasks", "gen_kwargs", "system_instruction", "output", "include_path", "model",
                                    "checkpoint", "run") else handle_arg_string(value)
    _check_values(out)
    return out


def _check_values(args: Dict[str, Any]) -> None:
    """Numbers that must be numbers, refused in one line before anything loads."""
    limit = args.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit <= 0):
        raise ConfigError(f"rlkit eval: limit={limit!r} must be a positive number (N items, or a fraction below 1)")
    for key in ("num_fewshot", "seed", "bootstrap_iters"):
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"rlkit eval: {key}={value!r} must be a whole number >= 0")


def _need_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise BackendUnavailableError("rlkit eval needs lm-evaluation-harness: pip install 'rlkit[eval]' "
                                      "(or bash scripts/install.sh eval)") from None


def _quiet(verbose: bool) -> None:
    if verbose:
        return
    import datasets

    datasets.disable_progress_bars()
    for name in ("lm_eval", "lm-eval", "datasets", "huggingface_hub", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def output_dir(args: Dict[str, Any], weights: Any) -> Path:
    if weights.run_dir is not None:
        return weights.run_dir / "eval"
    return Path(str(args.get("output") or "rlkit-eval"))


def label(weights: Any) -> str:
    """The model's name in lm-eval's results (and the folder lm-eval writes them under)."""
    if weights.run_dir is not None:
        return f"{weights.run_dir.name}-step{weights.step}" if weights.checkpoint else f"{weights.run_dir.name}-base"
    if weights.checkpoint:
        return Path(weights.checkpoint.split("://", 1)[-1]).name or weights.base_model
    return weights.base_model


def eval_command(argv: List[str]) -> int:
    """``rlkit eval`` (see the module docstring)."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    _need_lm_eval()
    args = parse_args(argv)
    if not args.get("tasks"):
        raise ConfigError("rlkit eval: tasks= is required (e.g. tasks=gsm8k,mbpp; see rlkit eval --help)")
    from rlkit.logging import setup_console_logging

    setup_console_logging()
    _quiet(bool(args.get("verbose", False)))
    from rlkit.harness import catalog as catalog_mod
    from rlkit.harness import tasks as tasks_mod
    from rlkit.harness.weights import resolve_weights

    weights = resolve_weights(args.get("model"), args.get("checkpoint"), args.get("run"))
    include = [p for p in str(args.get("include_path") or "").split(",") if p] or None
    catalog = catalog_mod.load_catalog(include)
    names = [t.strip() for t in str(args["tasks"]).split(",") if t.strip()]
    chosen = tasks_mod.select(catalog, names, local_data=bool(args.get("local_data", True)))
    online = bool(chosen.hub) and tasks_mod.hub_reachable()
    if not online:
        tasks_mod.go_offline()  # nothing waits on a network it cannot reach
    built = tasks_mod.build(catalog, chosen, online=online)
    lm = _open_model(args, weights)
    try:
        return _evaluate(args, weights, lm, built, chosen)
    finally:
        lm.close()


def _open_model(args: Dict[str, Any], weights: Any) -> Any:
    from rlkit.harness.model import RlkitLM

    model_args = {k: v for k, v in args.items() if k not in EVAL_KEYS and k not in WEIGHT_KEYS}
    return RlkitLM(weights=weights, backend=str(args.get("backend", "local")), **model_args)


def _evaluate(args: Dict[str, Any], weights: Any, lm: Any, built: List[Any], chosen: Any) -> int:
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import make_table

    out = output_dir(args, weights)
    tracker = EvaluationTracker(output_path=str(out))
    model_args = {"model": label(weights), "base_model": weights.base_model, "checkpoint": weights.checkpoint or None,
                  "backend": str(args.get("backend", "local"))}
    seed = args.get("seed")
    seeds = {} if seed is None else {"random_seed": int(seed), "numpy_random_seed": int(seed),
                                     "torch_random_seed": int(seed), "fewshot_random_seed": int(seed)}
    log_samples = bool(args.get("log_samples", True))
    started = time.time()
    results = lm_eval.simple_evaluate(
        model=lm, model_args=model_args, tasks=built, num_fewshot=_opt_int(args.get("num_fewshot")),
        limit=args.get("limit"), log_samples=log_samples, evaluation_tracker=tracker,
        system_instruction=args.get("system_instruction"), apply_chat_template=args.get("apply_chat_template", False),
        fewshot_as_multiturn=bool(args.get("fewshot_as_multiturn", True)), gen_kwargs=args.get("gen_kwargs"),
        bootstrap_iters=int(args.get("bootstrap_iters", 100000)), confirm_run_unsafe_code=bool(chosen.sandboxed),
        task_manager=TaskManager(include_defaults=False),  # the tasks are built: no 8-second index of lm-eval's tree
        **seeds)
    if results is None:
        return 1
    results["config"]["model"] = "rlkit"
    samples = results.pop("samples", None) if log_samples else None
    tracker.save_results_aggregated(results=results, samples=samples)
    if samples:
        for task_name in results["configs"]:
            tracker.save_results_samples(task_name=task_name, samples=samples[task_name])
    folder = out / str(tracker.general_config_tracker.model_name_sanitized)
    written = sorted(folder.glob(f"results_{tracker.date_id}.json")) if getattr(tracker, "date_id", None) else []
    if not written:
        raise ConfigError(f"rlkit eval: lm-eval did not write its results under {folder} (is it writable?)")
    print(f"rlkit ({weights.describe()}), limit: {args.get('limit')}, num_fewshot: {args.get('num_fewshot')}, "
          f"{time.time() - started:.1f}s")
    print(make_table(results))
    if "groups" in results:
        print(make_table(results, "groups"))
    notes = [f"{t}: rlkit's copy of {w}" for t, w in chosen.local.items()] + [f"{t}: code run in rlkit's sandbox" for t in chosen.sandboxed]
    if notes:
        print("; ".join(notes))
    print(f"results: {written[-1].resolve()}")
    sys.stdout.flush()
    return 0


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)
