"""A rollout endpoint: OpenAI chat completions backed by the current sampling client, recording
every call's exact tokens per episode, so agents written against the ``openai`` client train with
rlkit's RL loop (DESIGN §4; used by :class:`rlkit.rl.agents.AgentTask`).

Each episode gets an id, and the agent passes it as the ``model`` of its requests
(``openai.OpenAI(base_url=endpoint.base_url).chat.completions.create(model=episode_id, ...)``).
The request is rendered and completed by the same :class:`~rlkit.serve.completions.ChatService`
as ``rlkit serve`` (chat template, tools and ``tool_calls``, streaming from the finished
completion), on a sampling client that records what it sampled: the prompt token ids exactly as
rendered, the sampled token ids and their logprobs (under the distribution sampled from). Sampling
settings are the run's, not the agent's: temperature, top-p and top-k come from the episode (so the
trainer's ratio is on-policy), ``max_tokens`` is the smaller of the agent's and the run's, the
agent's ``stop`` strings are kept. ``n`` must be 1 (one recorded completion per call).

**Token-in/token-out.** :meth:`EpisodeRecord.trajectory` turns the calls into a trajectory: a
call whose prompt starts with the previous call's prompt + sampled tokens continues that sequence
(its new tokens are the observation: tool results, the next user turn, the assistant header);
a call whose prompt does not — the agent re-rendered or rewrote the history, or its template
re-tokenizes the sampled text differently — starts a new sequence (as ``StepResult.next_context``
does inside rlkit). Every sampled token is trained in the exact context it was sampled in.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from rlkit.serve.protocol import APIError, ChatRequest, Limits
from rlkit.serve.sources import FixedModel, ModelSource, Snapshot
from rlkit.tasks.base import Trajectory, Transition
from rlkit.types import SamplingParams


@dataclass
class RecordedCall:
    prompt: List[int]
    tokens: List[int]
    logprobs: List[float]
    stop_reason: str = "stop"


@dataclass
class EpisodeRecord:
    """One episode's calls, in the order they were answered."""

    episode_id: str
    params: SamplingParams
    calls: List[RecordedCall] = field(default_factory=list)

    def trajectory(self, sampler_version: int = 0) -> Trajectory:
        """The calls as a trajectory (see the module docstring); its last transition is ``done``."""
        traj = Trajectory(sampler_version=sampler_version)
        context: Optional[List[int]] = None
        for call in self.calls:
            extends = context is not None and len(call.prompt) >= len(context) and call.prompt[: len(context)] == context
            observation = call.prompt[len(context):] if extends else list(call.prompt)
            traj.transitions.append(Transition(observation=observation, action=list(call.tokens), action_logprobs=list(call.logprobs),
                                               stop_reason=call.stop_reason, new_sequence=context is not None and not extends))
            context = list(call.prompt) + list(call.tokens)
        if traj.transitions:
            traj.transitions[-1].done = True
        return traj

    @property
    def new_sequences(self) -> int:
        return sum(t.new_sequence for t in self.trajectory().transitions)


class RecordingClient:
    """A sampling client that samples with the episode's settings and records each completion."""

    def __init__(self, client: Any, record: EpisodeRecord, lock: threading.Lock):
        self.client, self.record, self._lock = client, record, lock

    def __getattr__(self, name: str) -> Any:  # get_tokenizer, context_window, compute_logprobs, ...
        return getattr(self.client, name)

    def sample(self, prompt: Any, num_samples: int = 1, sampling_params: Optional[SamplingParams] = None, **kwargs: Any) -> Any:
        if kwargs.get("include_prompt_logprobs") or kwargs.get("topk_prompt_logprobs"):  # a rescoring pass, not a turn
            return self.client.sample(prompt, num_samples=num_samples, sampling_params=sampling_params, **kwargs)
        run = self.record.params
        asked = sampling_params.max_tokens if sampling_params is not None else run.max_tokens
        params = run.model_copy(update={"max_tokens": min(asked, run.max_tokens),
                                        "stop": (sampling_params.stop if sampling_params is not None else None) or run.stop,
                                        # a forced tool call / response_format's grammar stays the request's own
                                        "constraint": sampling_params.constraint if sampling_params is not None else None})
        ids = prompt.to_ints() if hasattr(prompt, "to_ints") else [int(t) for t in prompt]
        future = self.client.sample(ids, num_samples=num_samples, sampling_params=params, **kwargs)
        return self._recorded(ids, future)

    async def _recorded(self, prompt: List[int], future: Any) -> Any:
        response = await future
        seq = response.sequences[0]
        call = RecordedCall(list(prompt), list(seq.tokens), [float(x) for x in (seq.logprobs or [])],
                            getattr(seq.stop_reason, "value", str(seq.stop_reason)))
        with self._lock:
            self.record.calls.append(call)
        return response


class RolloutEndpoint(ModelSource):
    """The endpoint's source and service: ``open(client, params) -> episode id``,
    ``close(id) -> EpisodeRecord``; :meth:`start` serves it (``base_url`` for the agent)."""

    def __init__(self, name: str = "rlkit-rollouts", limits: Optional[Limits] = None):
        self.name, self.aliases = name, []
        self.limits = limits or Limits(max_tokens=1 << 20, default_max_tokens=1 << 20)
        self._lock = threading.Lock()
        self._episodes: Dict[str, tuple] = {}  # id -> (record, ChatService)
        self._ids = itertools.count()
        self._salt = secrets.token_hex(3)
        self._last: Optional[Snapshot] = None
        self.server: Any = None

    # -- episodes ------------------------------------------------------------------------------

    def open(self, client: Any, params: SamplingParams) -> str:
        from rlkit.serve.completions import ChatService

        episode_id = f"episode-{self._salt}-{next(self._ids)}"
        record = EpisodeRecord(episode_id, params)
        source = FixedModel(RecordingClient(client, record, self._lock), name=episode_id, base_model=self.name)
        with self._lock:
            self._episodes[episode_id] = (record, ChatService(source, self.limits))
            self._last = source.current()
        return episode_id

    def close(self, episode_id: str) -> EpisodeRecord:
        """The episode's record; later calls naming it are refused (404)."""
        with self._lock:
            record, _ = self._episodes.pop(episode_id)
            return EpisodeRecord(record.episode_id, record.params, list(record.calls))

    # -- what create_app asks of a source / service ----------------------------------------------------

    def accepts(self, model: str) -> bool:
        with self._lock:
            return model in self._episodes

    def current(self) -> Snapshot:
        return self._last or Snapshot(client=None, base_model=self.name)

    def health(self) -> Dict[str, Any]:
        with self._lock:
            return {"status": "ok", "open_episodes": len(self._episodes)}

    async def complete(self, req: ChatRequest) -> Any:
        with self._lock:
            entry = self._episodes.get(req.model)
        if entry is None:
            raise APIError(404, f"The model '{req.model}' is not an open episode of this rollout endpoint (pass the episode id "
                                "you were given as the model).", param="model", code="model_not_found")
        if req.n != 1:
            raise APIError(400, f"n={req.n}: the rollout endpoint records one completion per call; use n=1.", param="n", code="invalid_value")
        return await entry[1].complete(req)

    # -- serving ---------------------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> "RolloutEndpoint":
        from rlkit.serve.app import create_app, start_server

        if self.server is None:
            self.server = start_server(create_app(self, limits=self.limits), host=host, port=port)
        return self

    @property
    def base_url(self) -> str:
        if self.server is None:
            raise RuntimeError("RolloutEndpoint.start() first")
        return self.server.base_url

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
