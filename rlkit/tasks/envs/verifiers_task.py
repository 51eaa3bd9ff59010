"""A `verifiers <https://github.com/PrimeIntellect-ai/verifiers>`_ environment as an RL task
(``train.task.name=verifiers``; needs the ``verifiers`` extra: ``pip install 'rlkit[verifiers]'``,
verifiers 0.4.0).

verifiers 0.4.0's stack is ``verifiers.v1``: a **taskset** (rows -> ``vf.Task`` s, each with its
prompt, system prompt, ``@vf.reward`` / ``@vf.metric`` functions, stops, judges and MCP tool
servers), an **env** (``vf.Env``: how one task becomes one episode — ``SingleAgentEnv`` for a plain
taskset, or your ``run(task, agents)`` driving turns through ``agent.interaction(task)``), and a
**harness** per seat (the program that plays it, talking to the model through the rollout's
interception endpoint). Two ways to name one:

- ``train.task.env=module:function`` — a function returning a ``vf.Env`` (``train.task.env_args``
  are its keyword arguments), e.g. ``vf.load_environment(vf.resolve_env_config({"taskset": {"id":
  "my_taskset"}}))``; or a module attribute that is one;
- ``train.task.env_id=ID`` — a verifiers taskset id (an importable package exporting its
  ``Taskset`` via ``__all__``, as ``vf eval ID`` takes it), with ``train.task.env_args`` merged
  into its env config (``{taskset: {...}, agent: {harness: {id: null}}}``).

**How an episode runs (the mapping).** Control is verifiers': its env decides the turns and its
harness calls the model. So an rlkit rollout is one ``env.run_episode(task, ctx)`` — verifiers'
own episode, unchanged: setup, the harness's chat loop with the task's MCP tools, the env's
``run`` (multi-turn: each ``interaction.turn(text)`` is the env's response and the next user
turn), stops, limits, ``finalize``, and scoring — with ``ctx`` pointing the model at **rlkit's
rollout endpoint** (:mod:`rlkit.serve.rollouts`): every model call is rendered with the model's
own chat template and sampled by the run's sampling client, and its exact prompt / sampled token
ids and logprobs are recorded (a call whose prompt extends the previous one continues that
sequence; one that does not starts a new sequence, so every sampled token trains in the exact
context it was sampled in). The G episodes of a group run at once on one event loop (their
requests meet in the sampler's batch). This is the mapping verifiers itself gives trainers ("any
trainer which can expose an OpenAI-compatible inference client"): a harness, its tools and its
interception only speak OpenAI chat, so driving the model directly would mean re-implementing
verifiers.

- problems: the taskset's tasks in load order; ``num_train`` for training (``None``: all but the
  last ``num_test``) and the next ``num_test`` held out for evaluation (an infinite taskset needs
  ``num_train``);
- reward: the trace's reward (verifiers' weighted sum of its ``@vf.reward`` s and judges; an
  episode with several trained traces, e.g. best-of-n, scores their mean); each reward function's
  score is the metric ``verifiers/<name>``, each ``@vf.metric`` ``verifiers/metric/<name>``, the
  model turns ``verifiers/turns``;
- seats: each seat that plays the run's model is the policy and its turns are trained; a seat with
  its own ``model``/``client`` is not (it needs that endpoint); a seat the env marks
  ``trainable = False`` but leaves on the run's model fails the episode (its turns would train);
- harnesses: verifiers' chat harnesses ``null`` and ``bash`` run **in this process**
  (:mod:`rlkit.tasks.envs.verifiers_chat`: verifiers' own chat program, not its ``uv``-installed
  copy, which needs the network); other harnesses (Codex, Claude Code, ...) run third-party
  programs in containers and are refused up front. Every seat's runtime is verifiers'
  ``subprocess`` runtime (a fresh folder on this machine; tool servers run there with this Python,
  this process's import path on ``PYTHONPATH``).

Failures stay in their episode (``agent/failed``, ``rollout/failed``, under
``train.rollout.on_failure``): a reward or env that raises, a harness that fails, a non-finite
reward, an episode past ``timeout_s``. Bad configuration — verifiers not installed, a
``module:function`` that does not exist, raises, or returns something that is not a verifiers
environment, an unknown ``env_id``, a seat on a harness rlkit cannot run — is one ``ConfigError``
line from :meth:`VerifiersTask.check_options`, before any model loads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import json
import logging
import math
import os
import sys
import threading
from typing import Any, Dict, List, Mapping, Optional

from rlkit.errors import ConfigError
from rlkit.rewards.base import RewardResult
from rlkit.tasks.base import EnvGroup, Task, split_problems

log = logging.getLogger("rlkit.tasks")
INSTALL = "install the verifiers extra: pip install 'rlkit[verifiers]' (or bash scripts/install.sh verifiers)"
#: the API key variable verifiers' client reads for rlkit's endpoint (unset: "EMPTY"; the endpoint takes any)
API_KEY_VAR = "RLKIT_VERIFIERS_API_KEY"


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ConfigError(f"train.task.name=verifiers needs the verifiers package (verifiers==0.4.0): {INSTALL}") from None
    return vf


def _line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _merged(base: Dict[str, Any], over: Mapping[str, Any]) -> Dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, Mapping) else value
    return out


def load_env(env: Optional[str], env_id: Optional[str], env_args: Optional[Mapping[str, Any]]) -> Any:
    """The ``vf.Env`` the options name, its seats checked (:func:`check_seats`), or one ConfigError line."""
    vf = _vf()
    if bool(env) == bool(env_id):
        raise ConfigError("train.task: give exactly one of env=module:function (a function returning a verifiers environment) "
                          "and env_id=ID (a verifiers taskset id, as `vf eval ID` takes it)")
    args = dict(env_args or {})
    if env:
        from rlkit.imports import import_object

        obj = import_object(env, "train.task.env")
        if isinstance(obj, vf.Env):
            if args:
                raise ConfigError(f"train.task.env_args: {env} is an environment, not a function that takes arguments")
            value = obj
        elif callable(obj):
            try:
                value = obj(**args)
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - user code: one line naming it
                raise ConfigError(f"train.task.env: {env}({', '.join(args)}) raised {_line(exc)}") from None
        else:
            raise ConfigError(f"train.task.env: {env} is a {type(obj).__name__}, not a function returning a verifiers environment")
        if not isinstance(value, vf.Env):
            taskset = type(value).__module__ if isinstance(value, vf.Taskset) else "my_taskset"
            fix = "wrap it" if isinstance(value, vf.Taskset) else "e.g."
            raise ConfigError(f"train.task.env: {env} returned {type(value).__name__}, not a verifiers environment (verifiers.v1.Env); "
                              f"{fix}: return vf.load_environment(vf.resolve_env_config({{'taskset': {{'id': '{taskset}'}}}}))")
    else:
        from rlkit.imports import ensure_user_paths

        ensure_user_paths()  # a taskset module in the working directory imports, as a module:function does
        config = _merged({"taskset": {"id": env_id}}, args)
        try:
            value = vf.load_environment(vf.resolve_env_config(config))
        except Exception as exc:  # noqa: BLE001 - verifiers' loader: not found, bad config, ...
            raise ConfigError(f"train.task.env_id={env_id}: {_line(exc)}") from None
    check_seats(value)
    return value


def check_seats(env: Any) -> None:
    """Every seat's harness is one rlkit runs in process (verifiers' ``null`` or ``bash``), else one ConfigError line."""
    from rlkit.tasks.envs.verifiers_chat import in_process

    for name, harness in env._harnesses.items():  # verifiers 0.4.0: a seat's loaded harness, by seat name
        if in_process(harness) is None:
            raise ConfigError(f"train.task: seat {name!r} plays verifiers' {harness.config.id!r} harness, a program verifiers runs in a "
                              "container or over the network; rlkit runs the chat harnesses (null, bash) in process: pin the seat's "
                              f"harness, e.g. env_args={{{name}: {{harness: {{id: null}}}}}} (env_id) or in your env's config")
        if getattr(harness.config, "search", False):
            raise ConfigError(f"train.task: seat {name!r}'s bash harness has search=true (a web search over the network); set it false")


def prepare(env: Any) -> Any:
    """``env`` as rlkit runs it: every seat on the subprocess runtime (a folder on this machine, nothing
    remote to tunnel to) and its null/bash harness run in process."""
    from verifiers.v1.runtimes import SubprocessConfig

    from rlkit.tasks.envs.verifiers_chat import in_process

    env._agent_specs = {name: spec.model_copy(update={"runtime": SubprocessConfig()}) for name, spec in env._agent_specs.items()}
    make_agents = env._episode_agents

    def episode_agents(*args: Any, **kwargs: Any) -> Any:
        agents = make_agents(*args, **kwargs)
        for agent in agents._agents.values():  # verifiers 0.4.0: the episode's Agent per seat
            agent.harness = in_process(agent.harness)
            agent.runtime_config = SubprocessConfig()
        return agents

    env._episode_agents = episode_agents
    return env


def export_import_paths() -> None:
    """Tool servers start as ``python -m module`` in the runtime's folder (this Python): put on
    ``PYTHONPATH`` what this process imports from beyond the interpreter's own folders — ``PYTHONPATH``
    entries (absolute, as ``sys.path`` holds them: a side folder such as .venv/site-verifiers) and the
    folders user code is imported from (:func:`rlkit.imports.user_paths`)."""
    import site

    from rlkit.imports import user_paths

    own = {os.path.abspath(p) for p in [*site.getsitepackages(), site.getusersitepackages()]}
    stdlib = os.path.abspath(sys.base_prefix) + os.sep
    folders: List[str] = []
    for p in [*sys.path, *map(str, user_paths())]:
        p = os.path.abspath(p or os.curdir)
        if p not in own and not p.startswith(stdlib) and os.path.isdir(p) and p not in folders:
            folders.append(p)
    os.environ["PYTHONPATH"] = os.pathsep.join(folders)


def episode_outcome(episode: Any, model: str) -> RewardResult:
    """A finished ``vf.Episode`` as a reward (see the module docstring); raises when it failed."""
    if not episode.ok:
        error = episode.last_error or next((t.errors[-1] for t in episode.traces if t.errors), None)
        why = f"{error.type}: {' '.join(error.message.split())[:300]}" if error is not None else "the episode did not complete"
        raise RuntimeError(f"the verifiers episode failed: {why}")
    policy = [t for t in episode.traces if t.agent is not None and t.agent.config.model == model]
    frozen = [t.agent.name or "agent" for t in policy if not t.agent.trainable]
    if frozen:
        raise RuntimeError(f"seat {frozen[0]!r} is marked untrainable but plays the run's model, so its turns would train: "
                           "pin its own model and client in the env's config")
    if not policy:
        raise RuntimeError("no trace of the episode played the run's model")
    sums: Dict[str, float] = {}
    counts: Dict[str, int] = {}

    def add(key: str, value: Any) -> None:
        if value is not None and isinstance(value, (int, float)) and math.isfinite(value):
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1

    for trace in policy:
        for name, reward in trace.rewards.items():
            add(f"verifiers/{name}", reward.score if reward is not None else None)
        for name, value in trace.metrics.items():
            add(f"verifiers/metric/{name}", value)
        add("verifiers/turns", trace.num_turns)
    metrics = {k: sums[k] / counts[k] for k in sums}
    reward = sum(t.reward for t in policy) / len(policy)
    return RewardResult(reward=float(reward), metrics=metrics,
                        info={"stop": [t.stop_condition for t in policy], "reply": policy[-1].last_reply[:2000]})


class _Loop:
    """One event loop on a thread of its own: verifiers' env serves (interception, shared tool
    servers) and its episodes run there for the task's lifetime. A ``SystemExit`` escaping one of
    verifiers' own tasks (its Prime helpers exit that way) is logged and the loop goes on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="rlkit-verifiers", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping:
            try:
                self.loop.run_forever()
            except BaseException as exc:  # noqa: BLE001 - one task's exit must not end every episode's loop
                log.warning("verifiers' event loop: %s", _line(exc))

    def submit(self, coro: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class VerifiersEnvTask(Task):
    """A verifiers environment: its tasks as problems, and :meth:`run`, one verifiers episode with the
    model at an OpenAI-compatible ``base_url`` / ``model`` — the agent that
    :class:`rlkit.rl.verifiers_agent.VerifiersTask` (``train.task.name=verifiers``) runs through
    rlkit's rollout endpoint. See the module docstring."""

    name = "verifiers_env"

    def __init__(self, env: Optional[str] = None, env_id: Optional[str] = None, env_args: Optional[Dict[str, Any]] = None,
                 num_train: Optional[int] = None, num_test: int = 0, timeout_s: float = 300.0):
        if timeout_s <= 0:
            raise ConfigError(f"train.task.timeout_s={timeout_s} must be > 0")
        self.env = prepare(_checked(env, env_id, env_args))
        self.timeout_s = float(timeout_s)
        self.tasks = split_tasks(self.env.taskset, num_train, num_test)
        export_import_paths()
        self._lock = threading.Lock()
        self._loop: Optional[_Loop] = None
        self._serving: Optional[contextlib.AsyncExitStack] = None
        self._serving_lock: Optional[asyncio.Lock] = None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if options.get("num_train") is not None and int(options["num_train"]) < 1:
            raise ConfigError(f"train.task.num_train={options['num_train']} must be >= 1 (or null: all but the held-out num_test)")
        if int(options.get("num_test") or 0) < 0:
            raise ConfigError(f"train.task.num_test={options['num_test']} must be >= 0")
        key = _key(options.get("env"), options.get("env_id"), options.get("env_args"))
        if key not in _CHECKED:
            _CHECKED[key] = load_env(options.get("env"), options.get("env_id"), options.get("env_args"))

    # -- problems ------------------------------------------------------------------------------------

    def problems(self, split: str) -> List[Dict[str, Any]]:
        out = {s: [{"index": i, "split": s, "key": t.key, "prompt": t.data.prompt_text} for i, t in enumerate(tasks)]
               for s, tasks in self.tasks.items()}
        return split_problems(self.name, out, split)

    def task_of(self, problem: Mapping[str, Any]) -> Any:
        return self.tasks[str(problem["split"])][int(problem["index"])]

    def messages(self, problem: Mapping[str, Any]) -> Optional[List[Dict[str, str]]]:
        data = self.task_of(problem).data
        if not isinstance(data.prompt, str):
            return None
        return ([{"role": "system", "content": data.system_prompt}] if data.system_prompt else []) + \
            [{"role": "user", "content": data.prompt}]

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> EnvGroup:
        raise ConfigError("a verifiers environment's episodes call the model themselves: train it with train.task.name=verifiers "
                          "(rlkit's rollout endpoint records their tokens)")

    # -- episodes ------------------------------------------------------------------------------------

    def run(self, problem: Mapping[str, Any], *, base_url: str, model: str) -> RewardResult:
        """One verifiers episode of ``problem``'s task, every seat on the run's model sampling from
        ``base_url`` as ``model`` (blocks; at most ``timeout_s``): its reward, or the line why it failed."""
        with self._lock:
            if self._loop is None:
                self._loop = _Loop()
            loop = self._loop
        future = loop.submit(self.episode(problem, base_url, model))
        try:
            return future.result(timeout=self.timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the episode ran past train.task.timeout_s={self.timeout_s:g}s") from None

    async def _serve(self) -> None:
        """Enter the env's ``serving()`` (interception, shared tool servers) once, on the task's loop."""
        if self._serving_lock is None:
            self._serving_lock = asyncio.Lock()
        async with self._serving_lock:
            if self._serving is None:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self._serving = stack

    async def episode(self, problem: Mapping[str, Any], base_url: str, model: str) -> RewardResult:
        vf = _vf()
        ctx = vf.ModelContext(model=model, client=vf.EvalClientConfig(base_url=base_url, api_key_var=API_KEY_VAR))

        async def play() -> Any:
            await self._serve()  # the first episode starts the env's servers (within its time)
            return await self.env.run_episode(self.task_of(problem), ctx)

        try:
            result = await asyncio.wait_for(play(), self.timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the episode ran past train.task.timeout_s={self.timeout_s:g}s") from None
        except SystemExit as exc:  # verifiers exits from a few helpers (e.g. no Prime login): the episode's failure
            raise RuntimeError(f"verifiers exited: {exc}") from None
        return episode_outcome(result, model)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            if self._serving is not None:
                with contextlib.suppress(Exception):
                    loop.submit(self._serving.aclose()).result(timeout=30)
                self._serving = None
            loop.close()


#: environments check_options built, handed to __init__ (built once per configuration)
_CHECKED: Dict[str, Any] = {}


def _key(env: Any, env_id: Any, env_args: Any) -> str:
    return json.dumps([env, env_id, env_args], sort_keys=True, default=str)


def _checked(env: Optional[str], env_id: Optional[str], env_args: Optional[Mapping[str, Any]]) -> Any:
    built = _CHECKED.pop(_key(env, env_id, env_args), None)
    return built if built is not None else load_env(env, env_id, env_args)


def split_tasks(taskset: Any, num_train: Optional[int], num_test: int) -> Dict[str, List[Any]]:
    """``{"train": [...], "test": [...]}`` from the taskset's tasks in load order (see the module docstring)."""
    num_test = int(num_test or 0)
    if num_train is None and not taskset.bounded:
        raise ConfigError(f"train.task.num_train: {type(taskset).__name__} is infinite; set how many of its tasks to train on")
    try:
        tasks = list(taskset) if num_train is None else list(itertools.islice(iter(taskset), int(num_train) + num_test))
    except Exception as exc:  # noqa: BLE001 - the taskset's load()
        raise ConfigError(f"train.task: loading {type(taskset).__name__}'s tasks raised {_line(exc)}") from None
    cut = len(tasks) - num_test if num_train is None else int(num_train)
    train, test = tasks[:max(cut, 0)], tasks[max(cut, 0):]
    if not train:
        raise ConfigError(f"train.task: {type(taskset).__name__} gave {len(tasks)} task(s), none left to train on with "
                          f"num_test={num_test}")
    return {"train": train, "test": test}
