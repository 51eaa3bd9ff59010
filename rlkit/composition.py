"""A run's config: composed by Hydra from the config tree and the overrides, then checked.

:func:`compose` is what ``rlkit train`` checks before anything runs (and what ``rlkit cost`` /
``rlkit repro`` and tests use to get a run's config); :func:`validate` is the same check on a config
Hydra composed itself (a trial a sampling sweeper produced); :func:`execute` runs a checked config's
loop in its run directory. The search path (the shipped tree, ``./configs``, ``--config-dir``) is
:mod:`rlkit.config_search`'s.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Union

from rlkit.errors import ConfigError, RlkitError
from rlkit.engine.capabilities import Capabilities
from rlkit.engine.registry import BackendSpec, backend_spec

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


def compose_with_hydra(
    overrides: Sequence[str], *, config_name: str = "config", config_dir: Optional[Path] = None
) -> Any:
    """The composed config *with* its ``hydra`` node (sweeper, launcher, sweep dir), unchecked;
    composition errors become one :class:`ConfigError` line."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.config import describe_config_error
    from rlkit.config_search import register_search_path, shipped_config_dir
    from rlkit.loops import register_configs

    register_configs()
    register_resolvers()
    register_search_path()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(
            config_dir=str(config_dir or shipped_config_dir()), version_base="1.3", job_name="rlkit"
        ):
            return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)
    except RlkitError:
        raise
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(describe_config_error(exc)) from None
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: Sequence[str], *, config_name: str = "config", config_dir: Optional[Path] = None) -> Any:
    """The config of one job (``recipe`` filled in), validated; raises :class:`ConfigError`."""
    from omegaconf import OmegaConf

    cfg = compose_with_hydra(overrides, config_name=config_name, config_dir=config_dir)
    recipe = cfg.hydra.runtime.choices.get("recipe")
    OmegaConf.set_struct(cfg, False)
    del cfg["hydra"]
    OmegaConf.set_struct(cfg, True)
    cfg.recipe = recipe
    validate(cfg)
    return cfg


def validate(cfg: Any) -> None:
    """Everything :func:`compose` checks, on a composed config: every value resolves and nothing
    mandatory is missing, no undeclared key, then :func:`check_config`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from rlkit.config import check_keys, describe_config_error

    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(describe_config_error(exc)) from None
    check_keys(cfg)
    check_config(cfg)


def check_config(cfg: Any) -> None:
    """What composition cannot check: the loop exists, its schema types ``train``, values are
    usable, the run directory can be written, data files exist."""
    from omegaconf import OmegaConf

    from rlkit.config import check_values
    from rlkit.loops import get_loop

    spec = get_loop(cfg.loop)
    schema = spec.schema_class()
    actual = OmegaConf.get_type(cfg.train)
    if actual is not schema and not same_section(schema, actual):
        raise ConfigError(
            f"recipe {cfg.recipe!r}: its train section is {getattr(actual, '__name__', actual)}, but loop "
            f"{cfg.loop!r} needs {schema.__name__}: add '/schema/train/{cfg.loop}@train' to the recipe's defaults"
        )
    check_values(cfg)
    backend = cfg.get("backend") or {}
    if backend.get("name"):
        spec = backend_spec(backend.name)
        caps = spec.capabilities_for(OmegaConf.to_container(backend, resolve=True, enum_to_str=True))
        check_lora_alpha(cfg, spec, caps)
        check_lora_layers(cfg, spec, caps)
        if not caps.scores_any_temperature:
            check_scoring_temperature(OmegaConf.to_object(cfg.train), spec.title, schema)
    if cfg.get("run_dir"):
        check_run_dir(Path(str(cfg.run_dir)).expanduser())
    if cfg.data is not None:
        from rlkit.data import resolve_path

        for part in ("train", "eval"):
            source = cfg.data.get(part)
            if source is not None and source.path and not source.hf_id:
                resolve_path(source.path)
    check_user_code(cfg)


def check_user_code(cfg: Any) -> None:
    """Every class a config names, resolved and its keywords checked before anything runs (the
    working directory importable, :mod:`rlkit.imports`): the loss is built (cheap, and its own
    ``__init__`` checks its values), ``train.task``'s class and ``train.generate.reward``'s
    ``_target_`` are resolved and their keywords checked, ``train.eval.harness.tasks`` are looked
    up in lm-eval's catalog; nothing else is called."""
    from omegaconf import OmegaConf

    from rlkit.imports import check_target_spec
    from rlkit.losses import build_loss
    from rlkit.tasks.base import resolve_task

    def plain(node: Any) -> Any:
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    if cfg.get("loss") is not None:
        build_loss(plain(cfg.loss))
    train = cfg.get("train")
    if train is None:
        return
    task = train.get("task") if hasattr(train, "get") else None
    if task is not None and OmegaConf.is_dict(task):
        resolve_task(plain(task), "train.task")
    harness = OmegaConf.select(train, "eval.harness.tasks") if OmegaConf.is_config(train) else None
    if harness:  # lm-eval's task names (rlkit.harness.during_training), before the run directory exists
        from rlkit.harness.during_training import check_task_names

        check_task_names(list(harness))
    generate = train.get("generate") if hasattr(train, "get") else None
    if generate is not None and generate.get("examples") and generate.get("reward") is not None:
        check_target_spec(plain(generate.reward), "train.generate.reward")


def same_section(schema: Any, actual: Any) -> bool:
    """Whether a loop's ``schema`` types a section composed as ``actual``: a subclass that declares
    no field of its own, only methods (``loop=task_sft`` over an RL recipe: :class:`TaskSFTConfig
    <rlkit.rl.config.TaskSFTConfig>` over ``RLConfig``)."""
    import dataclasses

    if not (isinstance(actual, type) and dataclasses.is_dataclass(actual) and issubclass(schema, actual)):
        return False
    return [f.name for f in dataclasses.fields(schema)] == [f.name for f in dataclasses.fields(actual)]


def check_scoring_temperature(train: Any, engine: str = "Tinker", schema: Any = None) -> None:
    """An engine whose trainer scores at temperature 1 only (``Capabilities.scores_any_temperature``
    false: Tinker, whose :func:`rlkit.backends.tinker.convert.native_data` refuses a datum asking for
    another): refuse, before anything starts, a run whose loop would ask — as every loop config
    declares (:meth:`rlkit.config.LoopConfig.scoring_temperature`: RL loops with
    ``score_with_temperature`` sampling at ``0 < T != 1``, on-policy distillation at ``T != 1``)."""
    declared = schema or type(train)  # the loop's schema says it (task_sft's, over an RL recipe's section)
    t = float(declared.scoring_temperature(train))
    if t != 1.0:
        raise ConfigError(f"train.temperature={t:g}: {engine}'s trainer scores at temperature 1 only; "
                          f"{declared.temperature_fix(train, engine)}")


def check_lora_alpha(cfg: Any, spec: BackendSpec, caps: Capabilities) -> None:
    """An engine whose capabilities fix the LoRA alpha (``fixed_lora_alpha``: Tinker's scale is the
    service's, alpha ``backend.lora_alpha`` / rank; its API has no alpha): refuse a ``model.alpha``
    it cannot honour before any session exists, so a recipe trains the same model on every engine
    or does not run."""
    model = cfg.get("model")
    if caps.fixed_lora_alpha is None or model is None or model.get("alpha") is None:
        return
    service = caps.fixed_lora_alpha
    if int(model.alpha) != service:
        settable = " (or backend.lora_alpha=... if your server was started with another --lora-alpha)" if "lora_alpha" in cfg.backend else ""
        raise ConfigError(f"model.alpha={model.alpha}: {spec.title}'s LoRA scale is fixed at alpha {service} / rank and "
                          f"cannot be set; use model.alpha={service}{settable}")


def check_lora_layers(cfg: Any, spec: BackendSpec, caps: Capabilities) -> None:
    """An engine whose capabilities say the LoRA layers are not settable (SageMaker's service
    selects them itself: attention and MLP): refuse a ``model.train_attn`` / ``model.train_mlp``
    of false before any session exists."""
    model = cfg.get("model")
    if caps.lora_layers_settable or model is None:
        return
    for key in ("train_attn", "train_mlp"):
        if model.get(key) is False:
            raise ConfigError(f"model.{key}=false: {spec.title} selects the LoRA layers itself (attention and MLP, "
                              f"both); use model.{key}=true on backend={spec.name}")


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


def execute(
    cfg: Any,
    run_dir: Union[str, Path],
    overrides: Sequence[str] = (),
    *,
    on_open: Optional[Callable[[Any], None]] = None,
) -> Dict[str, Any]:
    """Open the run directory and run the recipe's loop; return its final metrics. ``on_open(run)``
    gets the :class:`~rlkit.runs.Run` before the loop starts (nothing is written until the loop
    materialises it: ``run.materialized`` tells afterwards whether it did)."""
    from rlkit.loops import get_loop
    from rlkit.runs import Run

    from rlkit.backends.local.distributed import rank_run_dir

    check_config(cfg)
    fn = get_loop(cfg.loop).function()
    try:
        with Run.open(cfg, rank_run_dir(run_dir), overrides=overrides) as run:  # under torchrun: rank 0 writes the run
            if on_open is not None:
                on_open(run)
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
