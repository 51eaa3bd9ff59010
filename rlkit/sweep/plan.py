"""Before a sweep starts: what ``rlkit train -m`` hands to Hydra, checked first.

- **The basic sweeper** expands the sweep up front (lists, ``range(...)``, ``choice(...)``,
  ``glob(...)``, ``hydra.sweeper.params``), so every job is composed and checked before the first
  one starts: a typo never costs a half-finished sweep.
- **A sweeper that owns its search space** (Optuna, Nevergrad, Ax: ``interval(...)``, ``tag(log,
  ...)``, a sampler) gets the overrides untouched. rlkit checks what can be checked without
  sampling (the fixed overrides, every ``choice``/``range`` value and both ends of every
  ``interval``, each composed with the rest), tells the sweeper the objective's direction
  (``hydra.sweeper.direction`` for Optuna, ``optim.maximize`` for Nevergrad,
  ``ax_config.experiment.minimize`` for Ax) unless given on the command line, and each trial's
  config is checked again when the sweeper produces it (a bad trial fails alone, in one line).
- **Launchers** (basic, joblib, submitit local/slurm, ray, ...) all get the same sweep directory:
  it is resolved here once and passed as ``hydra.sweep.dir``, so a launcher's worker processes,
  which resolve the config again, cannot pick another timestamp. Each job's run directory is
  ``<sweep dir>/<job number>``.
- **hydra/launcher=rlkit_shared** runs the jobs as threads of one local engine
  (:mod:`rlkit.thread_runs`): a job that cannot share it is refused here, in one line.
- A Hydra plugin named but not installed, an unknown sweeper or launcher, a malformed sweep
  expression: one :class:`ConfigError` line, saying which ``pip install`` fixes a missing plugin.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from rlkit.errors import ConfigError
from rlkit.sweep.objective import Objective, objective_of
from rlkit.thread_runs import check_shareable

log = logging.getLogger("rlkit.sweep")

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
#: hydra/launcher=rlkit_shared (hydra_plugins/rlkit_shared_launcher): jobs as runs of one engine in this process
SHARED_LAUNCHER = "hydra_plugins.rlkit_shared_launcher.rlkit_shared_launcher.RlkitSharedLauncher"

#: (group, option) -> (the pip package, the plugin's module, the library it drives)
PLUGINS: Dict[Tuple[str, str], Tuple[str, str, Optional[str]]] = {
    ("hydra/sweeper", "optuna"): ("hydra-optuna-sweeper", "hydra_plugins.hydra_optuna_sweeper", "optuna"),
    ("hydra/sweeper", "nevergrad"): ("hydra-nevergrad-sweeper", "hydra_plugins.hydra_nevergrad_sweeper", "nevergrad"),
    ("hydra/sweeper", "ax"): ("hydra-ax-sweeper", "hydra_plugins.hydra_ax_sweeper", "ax"),
    ("hydra/launcher", "joblib"): ("hydra-joblib-launcher", "hydra_plugins.hydra_joblib_launcher", "joblib"),
    ("hydra/launcher", "submitit_local"): (
        "hydra-submitit-launcher",
        "hydra_plugins.hydra_submitit_launcher",
        "submitit",
    ),
    ("hydra/launcher", "submitit_slurm"): (
        "hydra-submitit-launcher",
        "hydra_plugins.hydra_submitit_launcher",
        "submitit",
    ),
    ("hydra/launcher", "ray"): ("hydra-ray-launcher", "hydra_plugins.hydra_ray_launcher", "ray"),
    ("hydra/launcher", "ray_aws"): ("hydra-ray-launcher", "hydra_plugins.hydra_ray_launcher", "ray"),
    ("hydra/launcher", "rq"): ("hydra-rq-launcher", "hydra_plugins.hydra_rq_launcher", "rq"),
}

#: sweeper ``_target_`` (its class name) -> (the config key of its direction, the value for a direction)
DIRECTION_KEYS: Dict[str, Tuple[str, Callable[[str], str]]] = {
    "OptunaSweeper": ("hydra.sweeper.direction", lambda d: d),
    "NevergradSweeper": ("hydra.sweeper.optim.maximize", lambda d: "true" if d == "maximize" else "false"),
    "AxSweeper": ("hydra.sweeper.ax_config.experiment.minimize", lambda d: "true" if d == "minimize" else "false"),
}


@dataclass
class SweepPlan:
    overrides: List[str]  # what Hydra gets: the user's, the pinned sweep dir, the sweeper's direction
    sweep_dir: Path
    sweeper: str  # the sweeper's _target_
    objective: Optional[Objective]
    jobs: Optional[List[List[str]]] = None  # every job's overrides, when known up front (basic sweeper)
    notes: List[str] = field(default_factory=list)

    @property
    def owns_search_space(self) -> bool:
        return self.sweeper != BASIC_SWEEPER


def parse(overrides: Sequence[str]) -> List[Any]:
    """Hydra's parse of the overrides; a malformed one is one :class:`ConfigError` line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed += parser.parse_overrides(overrides=[text])
        except OverrideParseException as exc:
            lines = [
                ln.strip()
                for ln in str(exc).splitlines()
                if ln.strip() and not ln.startswith(("Error parsing override", "See https://"))
            ]
            raise ConfigError(
                f"malformed override {text!r}: {' '.join(lines) or 'see Hydra override grammar'}"
            ) from None
    return parsed


def check_plugins(parsed: Sequence[Any]) -> None:
    """A sweeper or launcher named on the command line whose plugin is not installed: one line."""
    for o in parsed:
        group = o.key_or_group
        if group not in ("hydra/sweeper", "hydra/launcher") or o.is_sweep_override():
            continue
        name = str(o.value())
        known = PLUGINS.get((group, name))
        if known is None:
            continue  # basic, or a plugin rlkit does not know: composition says if it is missing
        package, module, library = known
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"{group}={name} needs a Hydra plugin that is not installed: pip install {package}")
        if library and importlib.util.find_spec(library) is None:
            raise ConfigError(
                f"{group}={name}: the plugin is installed but {library} is not: pip install {package} {library}"
            )


def _text(o: Any, value: Any) -> str:
    """``key=value`` for one end of an interval (a number)."""
    return f"{o.get_key_element()}={value!r}"


def _values(o: Any, group_options: Callable[[str], List[str]]) -> List[str]:
    """One override text per value of sweep ``o`` worth checking: every choice/range value (a glob
    expanded over the group's options), both ends of an interval."""
    from hydra.core.override_parser.types import IntervalSweep, ValueType

    value = o.value()
    if isinstance(value, IntervalSweep):
        return [_text(o, value.start), _text(o, value.end)]
    if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return [f"{o.get_key_element()}={name}" for name in value.filter(group_options(o.key_or_group))]
    return [f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()]


def _quote(path: Path) -> str:
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def plan_sweep(
    overrides: Sequence[str],
    compose_with_hydra: Callable[[Sequence[str]], Any],
    compose: Callable[[Sequence[str]], Any],
    group_options: Callable[[str], List[str]],
) -> SweepPlan:
    """Check a ``-m`` sweep (see the module docstring) and return what to hand to Hydra.
    ``compose_with_hydra`` / ``compose``: :mod:`rlkit.composition`'s, bound to the config name."""
    from omegaconf import OmegaConf

    parsed = parse(overrides)
    check_plugins(parsed)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    first = {id(o): _values(o, group_options)[:1] for o in sweeps}
    if any(not v for v in first.values()):
        empty = next(o for o in sweeps if not first[id(o)])
        raise ConfigError(f"{empty.input_line}: the sweep has no values")
    representative = fixed + [first[id(o)][0] for o in sweeps]
    with_hydra = compose_with_hydra(representative)
    sweeper = str(with_hydra.hydra.sweeper.get("_target_", ""))
    sweep_dir = Path(str(with_hydra.hydra.sweep.dir)).expanduser().resolve()
    params = with_hydra.hydra.sweeper.get("params") or {}
    from_config = [f"{k}={v}" for k, v in OmegaConf.to_container(params, resolve=False).items()] if params else []
    plan = SweepPlan(list(overrides) + [f"hydra.sweep.dir={_quote(sweep_dir)}"], sweep_dir, sweeper, None)
    shared = str(with_hydra.hydra.launcher.get("_target_", "")) == SHARED_LAUNCHER  # every job must share the engine

    if sweeper == BASIC_SWEEPER:
        plan.jobs = _expand(from_config, parsed, group_options)
        for i, job in enumerate(plan.jobs):  # every job's config, loss and task classes checked before job 0 runs
            try:
                cfg = compose(job)
                if shared:
                    check_shareable(cfg, "hydra/launcher=rlkit_shared")
            except ConfigError as exc:
                varied = [o for o in job if o not in fixed]
                if len(plan.jobs) < 2 or not varied:
                    raise
                raise ConfigError(f"sweep job {i} of {len(plan.jobs)} ({' '.join(varied)}): {exc}") from None
        plan.objective = objective_of(cfg) if plan.jobs else None
        return plan

    # a sweeper that owns its search space: check each value alone, then let it sample
    cfg = compose(representative)
    if shared:
        check_shareable(cfg, "hydra/launcher=rlkit_shared")
    given = {o.get_key_element(): o for o in parsed}
    for o in parse(from_config):
        if o.is_sweep_override() and o.get_key_element() not in given:
            sweeps.append(o)
    for o in sweeps:
        others = [t for t in representative if t.split("=", 1)[0] != o.get_key_element()]
        for text in _values(o, group_options):
            compose(others + [text])
    plan.objective = objective_of(cfg)
    if plan.objective is None:
        raise ConfigError(
            f"loop {cfg.loop!r} declares no objective for {sweeper.rsplit('.', 1)[-1]} to optimise: "
            "set sweep.objective=METRIC"
        )
    _tell_direction(plan, cfg, given)
    return plan


def _expand(from_config: List[str], parsed: List[Any], group_options: Callable[[str], List[str]]) -> List[List[str]]:
    """The basic sweeper's jobs: the cartesian product of every sweep, in its order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    given = {o.get_key_element() for o in parsed}
    merged = [o for o in parse(from_config) if o.get_key_element() not in given] + list(parsed)
    expanded = []
    for o in merged:  # BasicSweeper needs a config loader for glob(): expand it here
        if o.value_type == ValueType.GLOB_CHOICE_SWEEP:
            names = _values(o, group_options)
            expanded += (
                parse([f"{o.get_key_element()}=" + ",".join(n.split("=", 1)[1] for n in names)]) if names else []
            )
        else:
            expanded.append(o)
    for o in expanded:
        if o.is_interval_sweep():
            raise ConfigError(
                f"{o.input_line}: the basic sweeper runs lists, range() and choice() only; interval() needs a sweeper "
                "that samples, e.g. hydra/sweeper=optuna (pip install hydra-optuna-sweeper)"
            )
    try:
        batches = BasicSweeper.split_arguments(expanded, max_batch_size=None)
    except HydraException as exc:
        raise ConfigError(" ".join(str(exc).split())) from None
    return [job for batch in batches for job in batch]


def _tell_direction(plan: SweepPlan, cfg: Any, given: Dict[str, Any]) -> None:
    """Make the sweeper optimise in the objective's direction (see the module docstring)."""
    assert plan.objective is not None
    name = plan.sweeper.rsplit(".", 1)[-1]
    known = DIRECTION_KEYS.get(name)
    if known is None:
        plan.notes.append(
            f"{name}: rlkit cannot set its direction; make it {plan.objective.direction} {plan.objective.key}"
        )
        return
    key, render = known
    wanted = render(plan.objective.direction)
    if key in given:
        theirs = str(given[key].value()).lower()
        opposite = "maximize" if plan.objective.direction == "minimize" else "minimize"
        if theirs != wanted and cfg.sweep.direction is not None:
            raise ConfigError(
                f"{key}={theirs} contradicts sweep.direction={plan.objective.direction} ({plan.objective.key}); "
                "give one of them"
            )
        if theirs != wanted:  # the sweeper's direction, given explicitly, decides
            plan.objective = Objective(plan.objective.key, opposite)
            plan.overrides.append(f"sweep.direction={opposite}")
        return
    plan.overrides.append(f"{key}={wanted}")
