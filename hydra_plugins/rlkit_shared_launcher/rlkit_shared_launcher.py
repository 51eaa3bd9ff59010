"""``rlkit train -m ... hydra/launcher=rlkit_shared``: a sweep's jobs at once, as threads of this
process that share one local engine (one base model in memory, one sampler worker;
:mod:`rlkit.thread_runs`). Each job runs as the basic launcher would run it (Hydra's ``run_job``
with the job's own sweep config, output directory and overrides), so its run directory,
``metrics.jsonl``, checkpoints and ``result.json`` are what it writes alone.

- ``hydra.launcher.max_jobs``: jobs at once (null = every job of the batch the sweeper hands over).
- Hydra's ``HydraConfig`` is a process singleton: while the jobs run it is per thread.
- Each job's console lines print whole (never a live progress bar: a terminal has one).
- Hydra's job logging is configured once, before the jobs start.
- A job that cannot share the engine (:func:`rlkit.thread_runs.check_shareable`: a backend other
  than ``local``, ``backend.nproc > 1``, ``backend.sampler=vllm``, ``logger=wandb``) stops the
  sweep in one line before any job starts (``rlkit train -m`` says it before Hydra starts).
"""

# (no "from __future__ import annotations": Hydra executes plugin modules outside sys.modules, where
# dataclasses cannot resolve string annotations)
import contextlib
import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)

NAME = "rlkit_shared"


@dataclass
class RlkitSharedLauncherConf:
    _target_: str = "hydra_plugins.rlkit_shared_launcher.rlkit_shared_launcher.RlkitSharedLauncher"
    max_jobs: Optional[int] = None  # jobs at once; null = every job of a batch


ConfigStore.instance().store(group="hydra/launcher", name=NAME, node=RlkitSharedLauncherConf, provider="rlkit")


class _PerThreadHydraConfig(HydraConfig):
    """``HydraConfig.instance()`` while the jobs run: its ``cfg`` is the calling thread's (set by
    Hydra's ``run_job``), else the launcher's."""

    def __init__(self, shared: Any) -> None:  # not HydraConfig's: cfg is a property here
        self._local, self._shared = threading.local(), shared

    @property  # type: ignore[override]
    def cfg(self) -> Any:
        return getattr(self._local, "cfg", self._shared)

    @cfg.setter
    def cfg(self, value: Any) -> None:
        self._local.cfg = value


@contextlib.contextmanager
def _hydra_config_per_thread() -> Iterator[None]:
    original = HydraConfig.instance()
    per_thread = object.__new__(_PerThreadHydraConfig)  # not through Singleton.__call__
    per_thread.__init__(original.cfg)
    Singleton._instances[HydraConfig] = per_thread
    try:
        yield
    finally:
        Singleton._instances[HydraConfig] = original


class RlkitSharedLauncher(Launcher):
    def __init__(self, max_jobs: Optional[int] = None) -> None:
        super().__init__()
        if max_jobs is not None and int(max_jobs) < 1:
            from rlkit.errors import ConfigError

            raise ConfigError(f"hydra.launcher.max_jobs={max_jobs}: expected a positive number of jobs, or null")
        self.max_jobs = max_jobs
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self.services_created = 0  # shared services made by the last launch (one per distinct backend options)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from rlkit.thread_runs import check_shareable, run_threads, shared_runs

        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs as runs of one engine in this process")
        configs: List[DictConfig] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            check_shareable(sweep_config, f"hydra/launcher={NAME}")
            configs.append(sweep_config)
        configure_log(self.config.hydra.job_logging, self.config.hydra.verbose)  # once: not per thread
        with shared_runs() as services, _hydra_config_per_thread():  # a Ctrl-C stops every job (run_threads)
            returns = run_threads([functools.partial(self._run_one, c) for c in configs], max_at_once=self.max_jobs)
            self.services_created = services.created
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def _run_one(self, sweep_config: DictConfig) -> JobReturn:
        from rlkit.thread_runs import thread_run

        assert self.hydra_context is not None and self.task_function is not None
        with thread_run(console="lines"):
            return run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=sweep_config,
                           job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir", configure_logging=False)
