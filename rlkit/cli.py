"""The ``rlkit`` command line (also ``python -m rlkit``).

    rlkit --help                                   commands and recipes
    rlkit train recipe=sft_gsm8k                   one run (Hydra overrides: key=value, group=option)
    rlkit train recipe=sft_gsm8k model=tiny train.steps=20 train.learning_rate=3e-4
    rlkit train -m recipe=sft_gsm8k train.learning_rate=1e-4,3e-4 seed=0,1     a 2x2 sweep
    rlkit train resume=runs/sft_gsm8k/2025-01-01_12-00-00-000              continue a killed run
    rlkit train recipe=sft_gsm8k --cfg job         print the composed config (Hydra flags work)

**Adding a subcommand** is a function ``fn(argv: list[str]) -> int`` and one line::

    @command("cost", "estimate a recipe's token usage and price")
    def cost_command(argv): ...

(or ``COMMANDS["cost"] = Command("mypkg.cli:cost_command", "...")`` from another module, imported
lazily). An :class:`~rlkit.errors.RlkitError` raised by a command becomes one line on stderr and
exit code 2, with no traceback; so do Hydra/OmegaConf config errors in ``train``.

**train** composes ``configs/config.yaml`` with the overrides (every job of a ``-m`` sweep is
composed and checked *before* the first one starts, so a typo never costs a half-finished sweep),
then runs it through Hydra: the run directory is ``run_dir`` (default
``runs/<recipe>/<timestamp>``; in a sweep ``<sweep dir>/<job number>``), and the recipe's
``loop`` is looked up in :data:`rlkit.loops.LOOPS` and called with the config and a
:class:`rlkit.runs.Run` (:func:`execute`).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from rlkit.config_search import shipped_config_dir
from rlkit.errors import ConfigError, RlkitError

CONFIG_DIR = shipped_config_dir()  # the repository's configs/, packaged as rlkit/configs
PROG = "rlkit"


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
    """Print one error line on stderr; return ``code`` (exit with it)."""
    sys.stderr.write(error_line(message) + "\n")
    sys.stderr.flush()
    return code


# -- recipes and help ---------------------------------------------------------------------------------


def recipes() -> Dict[str, str]:
    """Recipe name -> its one-line description (the first comment of its YAML)."""
    out = {}
    for path in sorted((CONFIG_DIR / "recipe").glob("*.yaml")):
        desc = ""
        for line in path.read_text().splitlines():
            line = line.strip()
            if line.startswith("#") and "@package" not in line:
                desc = line.lstrip("#").strip()
                break
            if line and not line.startswith("#"):
                break
        out[path.stem] = desc
    return out


def group_options(group: str) -> List[str]:
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [ARGS]   ({PROG} COMMAND --help for a command's options)", "", "commands:"]
    width = max([len(n) for n in COMMANDS] + [8])
    for name, cmd in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {cmd.help}")
    lines += ["", f"recipes ({PROG} train recipe=NAME):"]
    found = recipes()
    rwidth = max([len(n) for n in found] + [8])
    for name, desc in found.items():
        lines.append(f"  {name:<{rwidth}}  {desc}")
    lines += ["", "config groups (GROUP=OPTION):"]
    for group in ("backend", "model", "loss", "logger"):
        lines.append(f"  {group:<8}  {', '.join(group_options(group))}")
    lines += [
        "",
        "examples:",
        f"  {PROG} train recipe=sft_gsm8k model=tiny train.steps=20",
        f"  {PROG} train -m recipe=sft_gsm8k train.learning_rate=1e-4,3e-4 seed=0,1",
        f"  {PROG} train resume=runs/sft_gsm8k/<timestamp>",
        f"  {PROG} train recipe=sft_gsm8k --cfg job        (print the composed config)",
    ]
    return "\n".join(lines)


def train_usage() -> str:
    lines = [
        f"usage: {PROG} train recipe=NAME [key=value ...] [GROUP=OPTION ...] [-m] [--cfg job]",
        "",
        "  key=value      override any config key (typed: a misspelt key or a wrong type is refused)",
        "  GROUP=OPTION   swap a config group: " + "; ".join(f"{g}: {', '.join(group_options(g))}" for g in ("backend", "model", "loss", "logger")),
        "  -m             sweep: comma-separated values run as separate jobs (train.learning_rate=1e-4,3e-4 seed=0,1)",
        "  run_dir=DIR    where the run goes (default runs/<recipe>/<timestamp>); rerunning into it resumes",
        "  resume=DIR     continue the run in DIR with its own config (new overrides may change logger only)",
        "  --cfg job      print the composed config and exit; `rlkit train recipe=NAME --help` shows Hydra's help",
        "",
        "recipes:",
    ]
    found = recipes()
    width = max([len(n) for n in found] + [8])
    lines += [f"  {name:<{width}}  {desc}" for name, desc in found.items()]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        from rlkit import __version__

        print(f"{PROG} {__version__}")
        return 0
    name, rest = args[0], args[1:]
    cmd = COMMANDS.get(name)
    if cmd is None:
        return fail(f"unknown command {name!r}; available: {', '.join(COMMANDS)} (see {PROG} --help)")
    try:
        return int(cmd(rest) or 0)
    except RlkitError as exc:
        return fail(exc)
    except KeyboardInterrupt:
        return fail("interrupted", 130)


# -- train ----------------------------------------------------------------------------------------------

_resolvers_registered = False


def register_resolvers() -> None:
    """``${rlkit.first:a,b,...}`` (first non-null argument) and ``${rlkit.timestamp:}``."""
    global _resolvers_registered
    if _resolvers_registered:
        return
    from omegaconf import OmegaConf

    def first(*values: Any) -> Any:
        return next((v for v in values if v not in (None, "", "null", "None")), None)

    def timestamp() -> str:
        now = time.time()
        return time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)) + f"-{int(now * 1000) % 1000:03d}"

    OmegaConf.register_new_resolver("rlkit.first", first, replace=True)
    OmegaConf.register_new_resolver("rlkit.timestamp", timestamp, use_cache=True, replace=True)
    _resolvers_registered = True


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


def _jobs(overrides: List[str], multirun: bool) -> List[List[str]]:
    """The override list of every job (a sweep expands to its cartesian product)."""
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [job for batch in batches for job in batch]


def compose(overrides: Sequence[str]) -> Any:
    """The config of one job (``recipe`` filled in), validated; raises :class:`ConfigError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.config import check_keys, describe_config_error
    from rlkit.loops import register_configs

    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="rlkit"):
            cfg = hydra_compose("config", overrides=list(overrides), return_hydra_config=True)
            recipe = cfg.hydra.runtime.choices.get("recipe")
            with_hydra = cfg
            OmegaConf.set_struct(with_hydra, False)
            del with_hydra["hydra"]
            OmegaConf.set_struct(with_hydra, True)
            cfg.recipe = recipe
            OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except RlkitError:
        raise
    except Exception as exc:  # noqa: BLE001 - Hydra/OmegaConf composition errors
        from hydra.errors import HydraException

        if isinstance(exc, (HydraException, OmegaConfBaseException)):
            raise ConfigError(describe_config_error(exc)) from None
        raise
    finally:
        GlobalHydra.instance().clear()
    check_keys(cfg)
    check_config(cfg)
    return cfg


def check_config(cfg: Any) -> None:
    """What composition cannot check: the loop exists, its schema types ``train``, data files exist."""
    from omegaconf import OmegaConf

    from rlkit.loops import get_loop

    from rlkit.config import check_values

    spec = get_loop(cfg.loop)
    schema = spec.schema_class()
    actual = OmegaConf.get_type(cfg.train)
    if actual is not schema:
        raise ConfigError(
            f"recipe {cfg.recipe!r}: its train section is {getattr(actual, '__name__', actual)}, but loop "
            f"{cfg.loop!r} needs {schema.__name__}: add '/schema/train/{cfg.loop}@train' to the recipe's defaults"
        )
    check_values(cfg)
    if cfg.get("run_dir"):
        check_run_dir(Path(str(cfg.run_dir)).expanduser())
    if cfg.data is not None:
        from rlkit.data import resolve_path

        for part in ("train", "eval"):
            source = cfg.data.get(part)
            if source is not None and source.path and not source.hf_id:
                resolve_path(source.path)


def check_run_dir(directory: Path) -> None:
    """Refuse a ``run_dir`` nothing can be written to, before Hydra creates it."""
    import os

    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"run_dir {directory} is a file, not a directory; choose another run_dir")
    ancestor = directory
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"run_dir {directory}: cannot write there ({ancestor} is a file)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"run_dir {directory}: cannot write there (no write permission on {ancestor})")


def execute(cfg: Any, run_dir: Union[str, Path], overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """Open the run directory and run the recipe's loop; return its final metrics."""
    from rlkit.loops import get_loop
    from rlkit.runs import Run

    check_config(cfg)
    fn = get_loop(cfg.loop).function()
    try:
        with Run.open(cfg, run_dir, overrides=overrides) as run:
            return fn(cfg, run)
    except BaseException:
        _remove_empty_dirs(Path(run_dir))  # Hydra made the folder; a refused run leaves nothing
        raise


def _remove_empty_dirs(directory: Path) -> None:
    """Remove ``directory`` and its parents while they are empty, up to the working directory."""
    stop = Path.cwd().resolve()
    directory = directory.resolve()
    while directory != stop and stop in directory.parents and directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
        directory = directory.parent


def _task(cfg: Any) -> Any:
    """The Hydra task: one job of ``rlkit train``."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.config import describe_config_error

    hc = HydraConfig.get()
    try:
        cfg.recipe = hc.runtime.choices.get("recipe")
        return execute(cfg, hc.runtime.output_dir, list(hc.overrides.task))
    except RlkitError as exc:
        sys.exit(fail(exc))
    except OmegaConfBaseException as exc:
        sys.exit(fail(describe_config_error(exc)))


_HYDRA_FLAGS = ("--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i", "--resolve", "--package", "-p",
                "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--shell-completion", "-sc",
                "--version", "--run", "-r", "--experimental-rerun")


@command("train", "train a recipe: rlkit train recipe=NAME [key=value ...]; -m sweeps comma-separated values")
def train_command(argv: List[str]) -> int:
    import hydra

    from rlkit.logging import setup_console_logging
    from rlkit.loops import register_configs

    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # library deprecation notes are not the user's
    setup_console_logging()
    register_configs()
    register_resolvers()
    multirun = any(a in ("-m", "--multirun") for a in argv)
    informational = any(a.split("=")[0] in _HYDRA_FLAGS for a in argv)
    overrides = [a for a in argv if not a.startswith("-") and a not in ("job", "hydra", "all")]
    flags = [a for a in argv if a not in overrides]
    wants_help = any(a in ("-h", "--help") for a in argv)
    if wants_help and not any(_key(o) in ("recipe", "resume") for o in overrides):
        print(train_usage())
        return 0
    if multirun and any(_key(o) == "resume" for o in overrides):
        raise ConfigError("resume= continues one run; to continue a sweep, rerun it with the same run_dir=")
    overrides = _with_resume_overrides(overrides)
    for job in _jobs(overrides, multirun) if not informational else [[o for o in overrides]]:
        if not (informational and multirun):
            compose(job)
    argv = flags + overrides
    saved_argv = sys.argv
    sys.argv = [f"{PROG} train", *argv]
    try:
        hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")(_task)()
    except ValueError as exc:  # Hydra's own flag checks ("Only one of --run, --multirun, --cfg ...")
        if not informational:
            raise
        raise ConfigError(str(exc)) from None
    finally:
        sys.argv = saved_argv
    return 0


def emulate_command(argv: List[str]) -> int:
    """``rlkit emulate sagemaker ...`` or ``rlkit emulate tinker ...`` (= ``rlkit serve tinker``)."""
    if argv[:1] == ["tinker"]:
        from rlkit.backends.tinker.server.cli import serve_tinker

        return serve_tinker(argv[1:], prog="rlkit emulate tinker")
    from rlkit.backends.sagemaker.cli import emulate_command as emulate_sagemaker

    return emulate_sagemaker(argv)


COMMANDS["serve"] = Command("rlkit.serve.cli:serve_command", "serve a model, checkpoint or training run over OpenAI's chat-completions API")
COMMANDS["endpoint"] = Command("rlkit.serve.cli:endpoint_command", "endpoint check URL: probe which chat-completions parameters an endpoint honours")
COMMANDS["repro"] = Command("rlkit.repro:repro_command", "repro recipe=NAME seeds=N: a recipe over seeds with baselines -> report (md, json, png)")
COMMANDS["cost"] = Command("rlkit.cost:cost_command", "cost recipe=NAME [run=DIR] [prices]: estimate tokens and money of a run, before or after")
COMMANDS["emulate"] = Command("rlkit.cli:emulate_command", "emulate sagemaker|tinker --port N: a local SageMaker training-session service or Tinker API (real SDKs, local engine)")
COMMANDS["sessions"] = Command("rlkit.backends.sagemaker.cli:sessions_command", "sessions list | stop NAME: SageMaker training sessions (running ones hold quota)")
