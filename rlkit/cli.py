"""The ``rlkit`` command line (also ``python -m rlkit``).

    rlkit --help                                   commands and recipes
    rlkit train recipe=sft_gsm8k                   one run (Hydra overrides: key=value, group=option)
    rlkit train recipe=sft_gsm8k model=tiny train.steps=20 train.learning_rate=3e-4
    rlkit train -m recipe=sft_gsm8k train.learning_rate=1e-4,3e-4 seed=0,1     a 2x2 sweep
    rlkit train resume=runs/sft_gsm8k/2025-01-01_12-00-00-000              continue a killed run
    rlkit train recipe=sft_gsm8k --cfg job         print the composed config (Hydra flags work)
    rlkit train -m recipe=sft_gsm8k_smoke hydra/sweeper=optuna hydra.sweeper.n_trials=8 \
        'train.learning_rate=tag(log,interval(1e-4,1e-2))'                     Optuna minimises eval/nll
    rlkit sweep report runs/sft_gsm8k_smoke/sweep-<time>                       the table, CSV and plot

**Adding a subcommand** is a function ``fn(argv: list[str]) -> int`` and one line::

    @command("cost", "estimate a recipe's token usage and price")
    def cost_command(argv): ...

(or ``COMMANDS["cost"] = Command("mypkg.cli:cost_command", "...")`` from another module, imported
lazily). An :class:`~rlkit.errors.RlkitError` raised by a command becomes one line on stderr and
exit code 2, with no traceback; so do Hydra/OmegaConf config errors in ``train``.

**train** composes ``configs/config.yaml`` (:mod:`rlkit.composition`; the search path, with a
project's own ``./configs`` and ``--config-dir``, is :mod:`rlkit.config_search`'s) with the
overrides and checks it before anything runs; a ``-m`` sweep is checked as :mod:`rlkit.sweep.plan`
says (every job up front for the basic sweeper; the search space handed untouched to Optuna,
Nevergrad or Ax). Then Hydra runs it with any launcher: the run directory is ``run_dir`` (default
``runs/<recipe>/<timestamp>``; in a sweep ``<sweep dir>/<job number>``), the recipe's ``loop`` is
looked up in :data:`rlkit.loops.LOOPS` and called with the config and a :class:`rlkit.runs.Run`,
and each job returns its objective to the sweeper (:mod:`rlkit.sweep.job`). A sweep ends with its
report (:mod:`rlkit.sweep.report`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from rlkit.composition import check_config, compose, execute, register_resolvers  # noqa: F401 - the CLI's API
from rlkit.config_search import GROUPS, extra_config_dirs, mark, options, shipped_config_dir
from rlkit.errors import ConfigError, RlkitError

CONFIG_DIR = shipped_config_dir()  # the repository's configs/, packaged as rlkit/configs
PROG = "rlkit"

# a launcher's worker process (joblib, submitit) imports this module to unpickle the task; the
# config it resolves there uses ${rlkit.first:...}
register_resolvers()


@dataclass
class Command:
    fn: Union[str, Callable[[List[str]], Optional[int]]]  # a callable or "module:function"
    help: str

    def __call__(self, argv: List[str]) -> Optional[int]:
        fn = self.fn
        if isinstance(fn, str):
            from rlkit.config import import_string

            fn = import_string(fn)
        return fn(argv)


#: subcommand name -> Command
COMMANDS: Dict[str, Command] = {}


def command(name: str, help: str) -> Callable:
    """Register ``fn(argv) -> exit code`` as ``rlkit <name>``."""

    def register(fn: Callable[[List[str]], Optional[int]]) -> Callable[[List[str]], Optional[int]]:
        COMMANDS[name] = Command(fn, help)
        return fn

    return register


def error_line(message: Any) -> str:
    text = " ".join(str(message).split("\n")).strip()
    return f"{PROG}: error: {text}"


def fail(message: Any, code: int = 2) -> int:
    """Print one error line on stderr; return ``code`` (exit with it). A rank under torch's elastic
    agent also records the line in its error file; under ``rlkit train ... backend.nproc=N`` the
    launcher prints it (once, naming the rank) instead of every rank."""
    import os

    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from rlkit.backends.local.ranks_launch import record_line

        if record_line(error_line(message)[len(f"{PROG}: error: "):]):
            return code
    sys.stderr.write(error_line(message) + "\n")
    sys.stderr.flush()
    return code


# -- recipes and help ---------------------------------------------------------------------------------


def recipes(extra_dirs: Sequence[Path] = ()) -> Dict[str, str]:
    """Recipe name -> its one-line description (the first comment of its YAML), the user's own
    (``./configs/recipe``, ``--config-dir``) marked and listed first."""
    return {
        name: " ".join(x for x in (mark(o), o.description) if x) for name, o in options("recipe", extra_dirs).items()
    }


def group_options(group: str, extra_dirs: Sequence[Path] = ()) -> List[str]:
    return sorted(options(group, extra_dirs))


def _recipe_lines(extra_dirs: Sequence[Path] = ()) -> List[str]:
    found = recipes(extra_dirs)
    width = max([len(n) for n in found] + [8])
    return [f"  {name:<{width}}  {desc}" for name, desc in found.items()]


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [ARGS]   ({PROG} COMMAND --help for a command's options)", "", "commands:"]
    width = max([len(n) for n in COMMANDS] + [8])
    for name, cmd in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {cmd.help}")
    lines += ["", f"recipes ({PROG} train recipe=NAME; [./configs] = this directory's own):", *_recipe_lines()]
    lines += ["", "config groups (GROUP=OPTION):"]
    for group in GROUPS:
        lines.append(f"  {group:<8}  {', '.join(group_options(group))}")
    lines += [
        "",
        "examples:",
        f"  {PROG} train recipe=sft_gsm8k model=tiny train.steps=20",
        f"  {PROG} train -m recipe=sft_gsm8k train.learning_rate=1e-4,3e-4 seed=0,1",
        f"  {PROG} train -m recipe=sft_gsm8k_smoke hydra/sweeper=optuna hydra.sweeper.n_trials=8 "
        "'train.learning_rate=tag(log,interval(1e-4,1e-2))'",
        f"  {PROG} train resume=runs/sft_gsm8k/<timestamp>",
        f"  {PROG} train recipe=sft_gsm8k --cfg job        (print the composed config)",
        f"  {PROG} sweep report runs/sft_gsm8k/sweep-<timestamp>",
    ]
    return "\n".join(lines)


def train_usage(extra_dirs: Sequence[Path] = ()) -> str:
    groups = "; ".join(f"{g}: {', '.join(group_options(g, extra_dirs))}" for g in GROUPS)
    lines = [
        f"usage: {PROG} train recipe=NAME [key=value ...] [GROUP=OPTION ...] [-m] [-cd DIR] [-cn NAME] [--cfg job]",
        "",
        "  key=value      override any config key (typed: a misspelt key or a wrong type is refused)",
        "  GROUP=OPTION   swap a config group: " + groups,
        "  -m             sweep: comma-separated values run as separate jobs (train.learning_rate=1e-4,3e-4 seed=0,1);",
        "                 hydra/sweeper=optuna (nevergrad, ax) samples interval(...)/choice(...) and optimises",
        "                 sweep.objective (default: the loop's held-out metric); hydra/launcher=joblib",
        "                 (submitit_local, submitit_slurm, ray) runs jobs in parallel; a sweep ends with its report",
        "  run_dir=DIR    where the run goes (default runs/<recipe>/<timestamp>); rerunning into it resumes",
        "  resume=DIR     continue the run in DIR with its own config (new overrides may change logger only)",
        "  -cd DIR        also look for configs in DIR (before the shipped ones; ./configs is always looked in)",
        "  -cn NAME       the primary config (default: config)",
        "  verbose=true   libraries' own progress bars and notes too",
        "  --cfg job      print the composed config and exit; `rlkit train recipe=NAME --help` shows Hydra's help",
        "",
        "recipes ([./configs] = this directory's own):",
        *_recipe_lines(extra_dirs),
    ]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The ``rlkit`` command. Called with no ``argv`` (the process's entry point), it also takes
    over Ctrl-C (:mod:`rlkit.interrupts`: first stops cleanly, second cancels queued work, third
    quits at once) and runs on the allocator ``RLKIT_ALLOCATOR`` names (:mod:`rlkit.malloc_preload`:
    mimalloc where installed, re-executing itself once with it preloaded); as a rank rlkit's launcher
    started, it dies with the launcher (:func:`rlkit.lifetime.die_with_launcher`)."""
    if argv is None:
        from rlkit import interrupts, malloc_preload
        from rlkit.lifetime import die_with_launcher

        try:
            malloc_preload.reexec_on_allocator()
        except RlkitError as exc:
            return fail(exc)
        die_with_launcher()  # a rank rlkit's launcher started ends with it, however it ends (rlkit.lifetime)
        interrupts.install()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from rlkit.version import __version__

        print(f"{PROG} {__version__}")
        return 0
    name, rest = args[0], args[1:]
    cmd = COMMANDS.get(name)
    if cmd is None:
        from rlkit.imports import suggest

        return fail(f"unknown command {name!r}; available: {', '.join(COMMANDS)} (see {PROG} --help){suggest(name, COMMANDS)}")
    try:
        return int(cmd(rest) or 0)
    except RlkitError as exc:
        return fail(exc)
    except KeyboardInterrupt:
        try:
            return fail("interrupted", 130)
        except KeyboardInterrupt:  # a second Ctrl-C while saying so
            return 130


# -- train ----------------------------------------------------------------------------------------------


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _with_resume_overrides(overrides: List[str]) -> List[str]:
    """For ``resume=DIR``: the overrides DIR was started with, then the new ones (which win)."""
    resume = next((o.split("=", 1)[1] for o in overrides if _key(o) == "resume"), None)
    if resume in (None, "", "null"):
        return overrides
    directory = Path(resume).expanduser()
    if not (directory / "config.yaml").is_file():
        raise ConfigError(f"resume={resume}: not an rlkit run directory (no config.yaml there)")
    import yaml

    from rlkit.runs import OVERRIDES

    saved_file = directory / OVERRIDES
    saved = yaml.safe_load(saved_file.read_text()) if saved_file.is_file() else None
    if not saved:
        recipe = (yaml.safe_load((directory / "config.yaml").read_text()) or {}).get("recipe")
        saved = [f"recipe={recipe}"] if recipe else []
    given = {_key(o) for o in overrides}
    merged = [o for o in saved if _key(o) not in given and _key(o) not in ("resume", "run_dir")]
    return merged + overrides


#: Hydra's command-line flags -> how many values follow (``--info`` takes one if it is a topic)
_HYDRA_FLAGS = {
    "--help": 0,
    "-h": 0,
    "--hydra-help": 0,
    "--version": 0,
    "--resolve": 0,
    "--run": 0,
    "-r": 0,
    "--multirun": 0,
    "-m": 0,
    "--shell-completion": 0,
    "-sc": 0,
    "--cfg": 1,
    "-c": 1,
    "--package": 1,
    "-p": 1,
    "--config-path": 1,
    "-cp": 1,
    "--config-name": 1,
    "-cn": 1,
    "--config-dir": 1,
    "-cd": 1,
    "--experimental-rerun": 1,
    "--info": "?",
    "-i": "?",
}
_INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")
_INFORMATIONAL = (
    "--cfg",
    "-c",
    "--help",
    "-h",
    "--hydra-help",
    "--info",
    "-i",
    "--resolve",
    "--package",
    "-p",
    "--shell-completion",
    "-sc",
    "--version",
    "--experimental-rerun",
)


@dataclass
class TrainArgs:
    overrides: List[str] = field(default_factory=list)
    flags: List[str] = field(default_factory=list)  # passed to Hydra as given
    config_dirs: List[Path] = field(default_factory=list)  # --config-dir/-cd (rlkit puts them first)
    config_name: str = "config"  # --config-name/-cn
    config_path: Optional[Path] = None  # --config-path/-cp: replaces the shipped tree

    @property
    def multirun(self) -> bool:
        return any(f in ("-m", "--multirun") for f in self.flags)

    @property
    def informational(self) -> bool:
        return any(f.split("=", 1)[0] in _INFORMATIONAL for f in self.flags)

    @property
    def wants_help(self) -> bool:
        return any(f in ("-h", "--help") for f in self.flags)


def parse_train_argv(argv: Sequence[str]) -> TrainArgs:
    """Split ``rlkit train``'s arguments into Hydra flags (with their values: ``-cd DIR`` and
    ``--config-dir=DIR`` alike) and overrides."""
    out = TrainArgs()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        name, has_value, inline = arg.partition("=")
        arity = _HYDRA_FLAGS.get(name) if arg.startswith("-") else None
        if arity is None:
            if arg.startswith("-"):
                raise ConfigError(f"unknown option {arg!r} for '{PROG} train' (see {PROG} train --help)")
            out.overrides.append(arg)
            i += 1
            continue
        value: Optional[str] = inline if has_value else None
        if value is None and (arity == 1 or (arity == "?" and i + 1 < len(args) and args[i + 1] in _INFO_TOPICS)):
            if i + 1 >= len(args):
                raise ConfigError(f"{name} needs a value (see {PROG} train --help)")
            value = args[i + 1]
            i += 1
        i += 1
        if name in ("--config-dir", "-cd", "--config-path", "-cp"):
            directory = Path(str(value)).expanduser()
            if not directory.is_dir():
                raise ConfigError(f"{name} {value}: not a directory")
            if name in ("--config-dir", "-cd"):
                out.config_dirs.append(directory.resolve())
            else:
                out.config_path = directory.resolve()
        elif name in ("--config-name", "-cn"):
            out.config_name = str(value)
        elif has_value:
            out.flags.append(arg)
        else:
            out.flags += [name] + ([value] if value is not None else [])
    return out


#: errno values that mean "the disk cannot take it" rather than a bug: one line, exit 2
DISK_ERRNOS = ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM")


def disk_error_line(exc: OSError) -> Optional[str]:
    """One line for a full, read-only or forbidden file system (``None`` for any other OSError)."""
    import errno

    codes = {getattr(errno, name) for name in DISK_ERRNOS if hasattr(errno, name)}
    if exc.errno not in codes:
        return None
    where = f"{exc.filename}: " if exc.filename else ""
    return (f"{where}{exc.strerror or exc} — the run stopped; its last checkpoint is intact: free space (or fix the "
            "permissions) and rerun the same command to resume")


def _task(cfg: Any) -> Any:
    """The Hydra task: one job of ``rlkit train`` (:func:`rlkit.sweep.job.run_job`); returns the
    job's objective to the sweeper."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from rlkit.logging import quiet_libraries
    from rlkit.sweep.job import one_line, run_job

    hc = HydraConfig.get()
    in_sweep = hc.mode == RunMode.MULTIRUN
    quiet_libraries(verbose=bool(cfg.get("verbose", False)))
    with open_dict(cfg):
        cfg.recipe = hc.runtime.choices.get("recipe")
        if in_sweep and cfg.logger.wandb and not cfg.logger.group:
            sweep_dir = Path(str(hc.sweep.dir))
            cfg.logger.group = f"{sweep_dir.parent.name}/{sweep_dir.name}"  # one W&B group per sweep
    try:
        return run_job(
            cfg,
            Path(hc.runtime.output_dir),
            list(hc.overrides.task),
            job=hc.job.num if in_sweep else None,
            sweep_dir=Path(str(hc.sweep.dir)) if in_sweep else None,
        )
    except RlkitError as exc:
        sys.exit(fail(exc))
    except OSError as exc:
        line = disk_error_line(exc)
        if line is None:
            raise
        sys.exit(fail(line))
    except Exception as exc:  # an OmegaConf error in a single run's config
        from omegaconf.errors import OmegaConfBaseException

        if isinstance(exc, OmegaConfBaseException):
            sys.exit(fail(one_line(exc)))
        from rlkit.backends.local.ranks_launch import record_exception

        if record_exception(exc):  # a rank of backend.nproc=N: the launcher says it in one line
            sys.exit(1)
        raise


@command("train", "train a recipe: rlkit train recipe=NAME [key=value ...]; -m sweeps (any Hydra sweeper/launcher)")
def train_command(argv: List[str]) -> int:
    import warnings

    from rlkit.config_search import register_search_path
    from rlkit.logging import setup_console_logging
    from rlkit.loops import register_configs

    warnings.filterwarnings("ignore", category=FutureWarning)  # library deprecation notes are not the user's
    setup_console_logging()
    register_configs()
    register_resolvers()
    register_search_path()
    args = parse_train_argv(argv)
    with extra_config_dirs(args.config_dirs):
        if args.wants_help and not any(_key(o) in ("recipe", "resume") for o in args.overrides):
            print(train_usage(args.config_dirs))
            return 0
        if args.multirun and any(_key(o) == "resume" for o in args.overrides):
            raise ConfigError("resume= continues one run; to continue a sweep, rerun it with the same run_dir=")
        return _train(args, _with_resume_overrides(args.overrides))


def _train(args: TrainArgs, overrides: List[str]) -> int:
    import logging

    import hydra

    from rlkit.composition import compose_with_hydra
    from rlkit.sweep.plan import parse, plan_sweep
    from rlkit.sweep.report import shown

    where = {"config_name": args.config_name, "config_dir": args.config_path}
    parse(overrides)  # a malformed override: one line, whatever the mode
    plan = None
    if args.informational:
        if not args.multirun:
            compose(overrides, **where)
    elif args.multirun:
        plan = plan_sweep(
            overrides,
            lambda o: compose_with_hydra(o, **where),
            lambda o: compose(o, **where),
            lambda group: group_options(group, args.config_dirs),
        )
        what = f"{len(plan.jobs)} jobs" if plan.jobs is not None else f"{plan.sweeper.rsplit('.', 1)[-1]} trials"
        objective = f"; objective {plan.objective}" if plan.objective else ""
        logging.getLogger("rlkit.sweep").info("sweep: %s into %s%s", what, shown(plan.sweep_dir), objective)
        for note in plan.notes:
            logging.getLogger("rlkit.sweep").warning("note: %s", note)
        overrides = plan.overrides
    else:
        cfg = compose(overrides, **where)  # bad input fails here, before the local engine is imported
        from rlkit.backends.local.distributed import launch, ranks_to_launch

        nproc = ranks_to_launch(cfg)  # under torchrun: joins the process group (before anything loads)
        if nproc:  # backend.nproc=N: this command again on N ranks under torch's elastic agent
            run_dir, pinned = _launched_run_dir(cfg, overrides)
            from rlkit.runs import resume_hint

            return launch(nproc, ["train", *args.flags, *[f"--config-dir={d}" for d in args.config_dirs], *overrides, *pinned],
                          lambda: resume_hint(run_dir))
    saved_argv = sys.argv
    sys.argv = [f"{PROG} train", *args.flags, *overrides]
    main_dir = str(args.config_path or CONFIG_DIR)
    try:
        hydra.main(config_path=main_dir, config_name=args.config_name, version_base="1.3")(_task)()
    except ValueError as exc:  # Hydra's own flag checks ("Only one of --run, --multirun, --cfg ...")
        if not args.informational:
            raise
        raise ConfigError(str(exc)) from None
    except SystemExit:  # Hydra reported an error (or a job exited): the report still gets written
        if plan is None:
            raise
        _sweep_report(plan)
        raise
    finally:
        sys.argv = saved_argv
    return _sweep_report(plan) if plan is not None else 0


def _launched_run_dir(cfg: Any, overrides: List[str]) -> "tuple[Optional[str], List[str]]":
    """The run directory N launched ranks train, and the override that pins it: with neither
    ``run_dir`` nor ``resume`` given, ``runs/<recipe>/<timestamp>`` chosen here once (every rank
    must agree on it, and a failure line names it)."""
    from rlkit.composition import register_resolvers

    given = cfg.get("resume") or cfg.get("run_dir")
    if given:
        return str(given), []
    recipe = next((o.split("=", 1)[1] for o in reversed(overrides) if _key(o) == "recipe"), None)
    if not recipe:
        return None, []
    from omegaconf import OmegaConf

    register_resolvers()
    stamp = OmegaConf.create({"t": "${rlkit.timestamp:}"}).t
    run_dir = f"runs/{recipe}/{stamp}"
    return run_dir, [f"run_dir={run_dir}"]


def _sweep_report(plan: Any) -> int:
    """Write and print the sweep's report; exit code 1 when a job failed (diverged is a result)."""
    from rlkit.sweep.report import summary, write_report

    if not plan.sweep_dir.is_dir():
        return 0
    try:
        report = write_report(plan.sweep_dir)
    except ConfigError:  # no job got as far as its run directory
        return 0
    print("\n" + summary(report), end="", flush=True)
    if report.failed:
        first = report.failed[0]
        return fail(
            f"{len(report.failed)} of {len(report.jobs)} jobs failed (job {first.job}: {first.error}); "
            f"see {report.files['md']}",
            1,
        )
    return 0


def emulate_command(argv: List[str]) -> int:
    """``rlkit emulate sagemaker ...`` or ``rlkit emulate tinker ...`` (= ``rlkit serve tinker``)."""
    if argv[:1] == ["tinker"]:
        from rlkit.backends.tinker.server.cli import serve_tinker

        return serve_tinker(argv[1:], prog="rlkit emulate tinker")
    from rlkit.backends.sagemaker.cli import emulate_command as emulate_sagemaker

    return emulate_sagemaker(argv)


COMMANDS["sweep"] = Command(
    "rlkit.sweep:sweep_command",
    "sweep report DIR: the table (Markdown, CSV) and plot of a sweep directory, finished or not",
)
COMMANDS["serve"] = Command("rlkit.serve.cli:serve_command", "serve a model, checkpoint or training run over OpenAI's chat-completions API")
COMMANDS["endpoint"] = Command("rlkit.serve.cli:endpoint_command", "endpoint check URL: probe which chat-completions parameters an endpoint honours")
COMMANDS["run"] = Command("rlkit.run_script:run_command", "run SCRIPT.py [ARGS] | -m MODULE: your own loop as python would run it, on rlkit's allocator and Ctrl-C policy")
COMMANDS["repro"] = Command("rlkit.repro:repro_command", "repro recipe=NAME seeds=N: a recipe over seeds with baselines -> report (md, json, png)")
COMMANDS["cost"] = Command("rlkit.cost_cli:cost_command", "cost recipe=NAME [run=DIR] [prices]: estimate tokens and money of a run, before or after")
COMMANDS["emulate"] = Command("rlkit.cli:emulate_command", "emulate sagemaker|tinker --port N: a local SageMaker training-session service or Tinker API (real SDKs, local engine)")
COMMANDS["sessions"] = Command("rlkit.backends.sagemaker.cli:sessions_command", "sessions list | stop NAME | stop --all-active | cleanup RUN_DIR: SageMaker training sessions and what runs left")
COMMANDS["conformance"] = Command("rlkit.conformance.cli:conformance_command", "conformance local|sagemaker|tinker [--endpoint|--base-url URL]: the session contract's test suite against an engine")
COMMANDS["eval"] = Command("rlkit.harness.cli:eval_command", "eval [model=M] [checkpoint=DIR | run=DIR] tasks=gsm8k,mbpp [limit=N]: lm-evaluation-harness on any engine (rlkit[eval])")
