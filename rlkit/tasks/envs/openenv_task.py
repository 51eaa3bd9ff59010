"""Any `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ environment as an RL task
(``train.task.name=openenv``; needs the ``envs`` extra: ``pip install rlkit[envs]``).

OpenEnv (Meta-PyTorch / Hugging Face, 2025) standardises environments as an ``Environment`` with
``reset(seed=...) -> Observation`` and ``step(Action) -> Observation`` over pydantic ``Action`` /
``Observation`` types (``done``, ``reward``, ``metadata``), served over HTTP/WebSocket by its own
``create_app``. Three ways to reach one:

- **in process**: ``train.task.env=module:Class`` (an ``openenv`` ``Environment`` subclass); each
  episode is a fresh instance;
- **over its server**: ``train.task.base_url=http://host:port`` (a server openenv's ``create_app``
  serves, started by you); each episode is a WebSocket session of openenv's ``GenericEnvClient``;
- **served by rlkit**: ``train.task.env=module:Class train.task.serve=true`` starts openenv's server
  on that class as a child process that dies with rlkit (:mod:`rlkit.tasks.envs.openenv_server`), then
  as above.

An episode (:mod:`rlkit.tasks.envs.text`): ``reset(seed=<the problem's seed>, **reset_kwargs)``, then
(observation rendered as a user turn -> the policy's reply -> parsed into the env's action ->
``step``) until ``done``; the reward of a turn is the observation's ``reward`` (``None`` = 0; an
in-process env with a ``rubric`` and no reward is scored by ``rubric(action, observation)``).

Mapping rules (each replaceable by a function of yours):

- ``render`` (observation -> text; ``module:function(observation: dict) -> str``): the default is
  the observation's one text field when it has exactly one (besides ``done``/``reward``/``metadata``),
  else one ``name: value`` line per field (JSON for non-text values).
- ``parse`` (reply -> action; ``module:function(reply: str, schema: dict) -> dict``, ``schema`` the
  action's JSON schema): the default, for an action with one field, is the whole reply stripped
  (a string field), the last number in it (integer / number), yes/no/true/false (boolean); for an
  action with several fields, the last JSON object in the reply. A reply that does not parse (a
  ``ValueError``, pydantic's validation error included) is an **invalid action**, never sent to the
  env: with ``on_invalid_action=end`` (the default) the episode ends with ``invalid_action_reward``;
  with ``retry`` the model is told why and replies again (the turn is spent). The metric
  ``invalid_action`` is the fraction of an episode's replies that did not parse. A parser that raises
  anything else fails the episode (counted in ``rollout/failed``).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional

from rlkit.errors import ConfigError
from rlkit.tasks.base import Problem
from rlkit.tasks.envs.text import ChatPolicy, TextEnv, TextEnvTask, TextTurn

RESERVED = ("done", "reward", "metadata")
SERVER_MODULE = "rlkit.tasks.envs.openenv_server"  # the child that serves an Environment class on openenv's server
READY = "rlkit-openenv-server listening "
INSTALL = "install the envs extra: pip install 'rlkit[envs]' (or bash scripts/install.sh envs)"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _openenv() -> Any:
    try:
        from openenv.core.env_server import interfaces
    except ImportError:
        raise ConfigError(f"train.task.name=openenv needs the openenv package: {INSTALL}") from None
    return interfaces


def environment_class(path: str, where: str = "train.task.env") -> type:
    """The ``Environment`` subclass ``module:Class`` names, or one ConfigError line."""
    from rlkit.imports import import_object

    cls = import_object(path, where)
    if not (isinstance(cls, type) and issubclass(cls, _openenv().Environment)):
        raise ConfigError(f"{where}: {path} is not an openenv Environment subclass "
                          "(subclass openenv.core.env_server.interfaces.Environment, with reset/step/state)")
    return cls


def env_types(cls: type, action: Optional[str] = None, where: str = "train.task") -> tuple:
    """``(Action class, Observation class)`` of an ``Environment`` subclass: ``Environment[Act, Obs,
    State]``'s arguments, else ``step``'s / ``reset``'s annotations; ``action`` (``module:Class``) wins."""
    from openenv.core.env_server.types import Action, Observation

    from rlkit.imports import import_object

    act = obs = None
    for base in getattr(cls, "__orig_bases__", ()):
        args = [a for a in typing.get_args(base) if isinstance(a, type)]
        act = act or next((a for a in args if issubclass(a, Action)), None)
        obs = obs or next((a for a in args if issubclass(a, Observation)), None)
    try:
        hints_step = typing.get_type_hints(cls.step)
        hints_reset = typing.get_type_hints(cls.reset)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to the generic arguments
        hints_step, hints_reset = {}, {}
    act = act or _subclass(hints_step.get("action"), Action)
    obs = obs or _subclass(hints_step.get("return"), Observation) or _subclass(hints_reset.get("return"), Observation)
    if action:
        act = import_object(action, f"{where}.action")
        if not (isinstance(act, type) and issubclass(act, Action)):
            raise ConfigError(f"{where}.action: {action} is not an openenv Action subclass")
    if act is None:
        raise ConfigError(f"{where}.env: cannot tell {cls.__name__}'s action type (declare it as Environment[MyAction, "
                          f"MyObservation, State] or annotate step(action: MyAction)); or set {where}.action=module:Class")
    return act, obs or Observation


def _subclass(tp: Any, base: type) -> Optional[type]:
    return tp if isinstance(tp, type) and issubclass(tp, base) else None


def action_fields(schema: Mapping[str, Any]) -> Dict[str, Any]:
    """The action's own fields (JSON schema properties), ``metadata`` left out."""
    return {k: v for k, v in (schema.get("properties") or {}).items() if k not in RESERVED}


def parse_action(reply: str, schema: Mapping[str, Any]) -> Dict[str, Any]:
    """The default reply -> action mapping (see the module docstring); ``ValueError`` when the
    reply does not parse."""
    fields = action_fields(schema)
    if len(fields) == 1:
        (name, spec), = fields.items()
        kinds = {spec.get("type")} | {s.get("type") for s in spec.get("anyOf", [])}
        if "string" in kinds:
            return {name: reply.strip()}
        if kinds & {"integer", "number"}:
            numbers = _NUMBER.findall(reply)
            if not numbers:
                raise ValueError(f"no number in the reply for {name!r}")
            value = float(numbers[-1])
            return {name: int(value) if "integer" in kinds and value.is_integer() else value}
        if "boolean" in kinds:
            word = reply.strip().lower().rstrip(".")
            if word in ("yes", "true", "1"):
                return {name: True}
            if word in ("no", "false", "0"):
                return {name: False}
            raise ValueError(f"{name!r} wants yes or no")
    found = json_objects(reply)
    if not found:
        raise ValueError(f"no JSON object with the action's fields {sorted(fields)} in the reply")
    return found[-1]


def json_objects(text: str) -> list:
    """The JSON objects written in ``text``, in order (each ``{`` tried as a start)."""
    decoder, out, at = json.JSONDecoder(), [], text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except ValueError:
            at = text.find("{", at + 1)
            continue
        if isinstance(value, dict):
            out.append(value)
        at = text.find("{", end)
    return out


PROBE_REPLIES = ("1", "yes", '{"a": 1}', "")


def check_parser(parse: Callable[..., Any], name: str, schema: Mapping[str, Any]) -> None:
    """A parser of the user's, tried on a few replies before the run: it may return a mapping or
    raise ``ValueError`` (the reply does not parse); anything else it raises is one ConfigError line."""
    for reply in PROBE_REPLIES:
        try:
            value = parse(reply, schema)
        except ValueError:
            continue
        except Exception as exc:  # noqa: BLE001 - the user's code: say what it raised, on which reply
            raise ConfigError(f"train.task.parse: {name} raised {type(exc).__name__}: {' '.join(str(exc).split())[:120]} on the "
                              f"reply {reply!r}; a parser returns the action's fields as a dict, or raises ValueError "
                              "for a reply that does not parse") from None
        if not isinstance(value, Mapping) and not hasattr(value, "model_dump"):
            raise ConfigError(f"train.task.parse: {name} returned {type(value).__name__} for the reply {reply!r}; "
                              "return the action's fields as a dict (or the Action)")


def render_observation(observation: Mapping[str, Any]) -> str:
    """The default observation -> text mapping (see the module docstring)."""
    own = {k: v for k, v in observation.items() if k not in RESERVED}
    texts = [k for k, v in own.items() if isinstance(v, str)]
    if len(texts) == 1 and all(v in (None, "", [], {}) for k, v in own.items() if k != texts[0]):
        return own[texts[0]]
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)}" for k, v in own.items())


class OpenEnvEpisode(TextEnv):
    """One episode: an in-process instance or a WebSocket session (``client``)."""

    def __init__(self, task: "OpenEnvTask", seed: int):
        self.task, self.seed = task, seed
        self.env: Any = None
        self.client: Any = None
        self.turns = self.invalid = 0

    def reset(self) -> TextTurn:
        if self.task.base_url:
            from openenv.core.generic_client import GenericEnvClient

            self.client = GenericEnvClient(base_url=self.task.base_url).sync()
            self.client.connect()
            result = self.client.reset(seed=self.seed, **self.task.reset_kwargs)
            return TextTurn(observation=self.task.render_fn(dict(result.observation)))
        self.env = self.task.env_cls()
        observation = self.env.reset(seed=self.seed, **self.task.reset_kwargs)
        return TextTurn(observation=self.task.render_fn(_fields(observation)))

    def step(self, reply: str) -> TextTurn:
        self.turns += 1
        try:
            action = self.task.parse_fn(reply, self.task.action_schema)
            if self.task.action_cls is not None:
                action = self.task.action_cls.model_validate(action)
        except ValueError as exc:  # pydantic's ValidationError is one
            first = " ".join(str(exc).split())[:200]
            self.invalid += 1
            if self.task.on_invalid_action == "retry":  # a wasted turn: the env never sees it
                return TextTurn(observation=f"That is not a valid action ({first}). {self.task.retry_hint}".strip(),
                                reward=self.task.invalid_action_reward, metrics=self._metrics(), info={"invalid_action": first})
            return TextTurn(reward=self.task.invalid_action_reward, done=True, metrics=self._metrics(), info={"invalid_action": first})
        if self.client is not None:
            result = self.client.step(action if isinstance(action, dict) else action.model_dump())
            observation, reward, done = dict(result.observation), result.reward, bool(result.done)
        else:
            obs = self.env.step(action)
            observation, reward, done = _fields(obs), obs.reward, bool(obs.done)
            if reward is None and getattr(self.env, "rubric", None) is not None:
                reward = self.env.rubric(action, obs)
        reward = float(reward or 0.0)
        if not math.isfinite(reward):
            raise ValueError(f"the environment's reward is {reward}")
        return TextTurn(observation="" if done else self.task.render_fn(observation), reward=reward, done=done,
                        metrics=self._metrics())

    def _metrics(self) -> Dict[str, float]:
        """``invalid_action``: the fraction of this episode's replies that did not parse; ``turns``."""
        return {"invalid_action": self.invalid / max(self.turns, 1), "turns": float(self.turns)}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        elif self.env is not None:
            self.env.close()


def _fields(observation: Any) -> Dict[str, Any]:
    return observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)


class OpenEnvTask(TextEnvTask):
    """An OpenEnv environment, in process or over its server (see the module docstring)."""

    name = "openenv"

    def __init__(self, env: Optional[str] = None, base_url: Optional[str] = None, serve: bool = False,
                 action: Optional[str] = None, render: Optional[str] = None, parse: Optional[str] = None,
                 reset_kwargs: Optional[Dict[str, Any]] = None, invalid_action_reward: float = 0.0,
                 on_invalid_action: str = "end", retry_hint: str = "Reply again.", max_concurrent_envs: int = 64,
                 num_train: int = 256, num_test: int = 32, seed: int = 0,
                 system_prompt: Optional[str] = None, reset_timeout_s: float = 60.0):
        super().__init__(num_train=num_train, num_test=num_test, seed=seed, system_prompt=system_prompt,
                         reset_timeout_s=reset_timeout_s)
        from rlkit.imports import import_object

        self.check_options(dict(env=env, base_url=base_url, serve=serve, action=action, render=render, parse=parse,
                                on_invalid_action=on_invalid_action))
        self.reset_kwargs = dict(reset_kwargs or {})
        self.invalid_action_reward = float(invalid_action_reward)
        self.on_invalid_action, self.retry_hint = on_invalid_action, retry_hint
        self.render_fn: Callable[[Mapping[str, Any]], str] = import_object(render, "train.task.render") if render else render_observation
        self.parse_fn: Callable[[str, Mapping[str, Any]], Any] = import_object(parse, "train.task.parse") if parse else parse_action
        self.server: Any = None
        self.env_cls: Any = None
        self.action_cls: Any = None
        if env:
            self.env_cls = environment_class(env)
            self.action_cls, self.observation_cls = env_types(self.env_cls, action)
            self.action_schema: Dict[str, Any] = self.action_cls.model_json_schema()
        if serve:
            self.server = start_server(env or "", action, max_concurrent_envs)
            base_url = self.server.url
            self.action_cls = None  # sent as JSON to the server, which validates it
        self.base_url = base_url.rstrip("/") if base_url else None
        if self.base_url and not serve:
            self.action_schema = server_schema(self.base_url)["action"]

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        env, base_url, serve = options.get("env"), options.get("base_url"), bool(options.get("serve"))
        if options.get("on_invalid_action", "end") not in ("end", "retry"):
            raise ConfigError(f"train.task.on_invalid_action={options['on_invalid_action']!r}: choose end or retry")
        if bool(env) == bool(base_url):
            raise ConfigError("train.task: give exactly one of env=module:Class (an openenv Environment, run in process "
                              "or with serve=true on openenv's server) and base_url=URL (a running openenv server)")
        if serve and not env:
            raise ConfigError("train.task.serve=true serves train.task.env=module:Class; set it (or drop serve for base_url)")
        if env:
            schema = env_types(environment_class(env), options.get("action"))[0].model_json_schema()
        else:
            schema = server_schema(str(base_url))["action"]
        from rlkit.imports import import_object

        for key in ("render", "parse"):
            if options.get(key) and not callable(import_object(options[key], f"train.task.{key}")):
                raise ConfigError(f"train.task.{key}: {options[key]} is not a function")
        if options.get("parse"):
            check_parser(import_object(options["parse"], "train.task.parse"), options["parse"], schema)

    def make_env(self, problem: Problem, policy: Optional[ChatPolicy]) -> OpenEnvEpisode:
        return OpenEnvEpisode(self, int(problem["seed"]))

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@dataclass
class ServedEnv:
    url: str
    child: Any

    def stop(self) -> None:
        from rlkit.lifetime import end_group

        end_group(self.child.pid, lambda: self.child.poll() is not None)
        self.child.wait()


def start_server(env: str, action: Optional[str], max_concurrent_envs: int, timeout_s: float = 60.0) -> ServedEnv:
    """Start the server on ``env`` (``module:Class``); one ConfigError line if it does not come up."""
    import subprocess

    from rlkit.lifetime import spawn

    args = [sys.executable, "-m", SERVER_MODULE, "--env", env, "--max-concurrent-envs", str(max_concurrent_envs)]
    if action:
        args += ["--action", action]
    child = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    assert child.stdout is not None
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if line.startswith(READY):
            return ServedEnv(line[len(READY):].strip(), child)
        if not line and child.poll() is not None:
            break
    child.kill()
    err = (child.stderr.read() if child.stderr else "").strip().splitlines()
    raise ConfigError(f"train.task.serve: openenv's server on {env} did not start ({err[-1] if err else 'no output'})")


def server_schema(base_url: str, timeout_s: float = 10.0) -> Dict[str, Any]:
    """The running server's ``/schema`` (``action``, ``observation``), or one ConfigError line when
    nothing answers at ``base_url`` or what answers is not an OpenEnv server."""
    import httpx

    url = base_url.rstrip("/")
    try:
        health = httpx.get(f"{url}/health", timeout=timeout_s)
        schema = httpx.get(f"{url}/schema", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ConfigError(f"train.task.base_url: no server answers at {url} ({type(exc).__name__}); start the openenv "
                          "server first, or let rlkit start it: train.task.env=module:Class train.task.serve=true") from None
    body: Any = None
    try:
        body = schema.json()
    except ValueError:
        pass
    if health.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("action"), dict) \
            or "observation" not in body:
        raise ConfigError(f"train.task.base_url: {url} is not an OpenEnv server (GET /health gave {health.status_code}, "
                          "GET /schema no action/observation schema); point it at a server openenv's create_app serves")
    return body

