"""One chat completion: messages -> chat template -> ``SamplingClient.sample`` -> OpenAI choices.

Requests never block the event loop on the model: ``sample`` queues the work and returns an
:class:`~rlkit.futures.APIFuture` at once, which the handler awaits; the local sampler drains every
request queued when it wakes and decodes them together, so concurrent HTTP requests share one
batched decode. ``n`` maps to ``num_samples`` (the prompt is prefilled once for all n).

Logprobs are the model's log-probabilities *before* temperature / top-p / top-k (what vLLM returns
by default). At temperature 0 or 1 they are exactly the sampler's own logprobs; at any other
temperature, or when ``top_logprobs`` is asked for, the completion is scored once more through
the same sampler (``include_prompt_logprobs`` / ``topk_prompt_logprobs`` on prompt + completion).

Requests with tools render through :class:`~rlkit.tools.ToolRenderer` and their completions are
parsed into ``tool_calls`` (:mod:`rlkit.serve.tools`); they stream from the finished completion.
A forced call (``tool_choice`` required / named) and ``response_format`` are decoded under a
constraint (``SamplingParams.constraint``): the call's grammar, or the content's JSON schema.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from rlkit.errors import InvalidInputError, RlkitError
from rlkit.serve.capabilities import accepts_on_token, context_window
from rlkit.serve.protocol import APIError, ChatRequest, Limits, bad_request, choice_delta, chunk_body, completion_body, new_id, usage_body
from rlkit.serve.sources import ModelSource, Snapshot
from rlkit.serve.text import ChoiceText, TokenText, finish_choice, logprob_entry
from rlkit.serve.tools import forced_choice, prefill_for, tool_choice_result, tool_constraint
from rlkit.types import Constraint, SamplingParams, StopReason


@dataclass
class Completion:
    """The result of one request, before it is shaped as a body or a stream."""

    id: str
    created: int
    model: str
    snapshot: Snapshot
    request: ChatRequest
    choices: List[ChoiceText]
    logprobs: Optional[List[List[Dict[str, Any]]]]  # per choice, logprobs.content
    prompt_tokens: int
    completion_tokens: int
    tool_calls: List[Optional[List[Dict[str, Any]]]] = field(default_factory=list)  # per choice, when it called tools

    def calls(self, i: int) -> Optional[List[Dict[str, Any]]]:
        return self.tool_calls[i] if i < len(self.tool_calls) else None

    def body(self) -> Dict[str, Any]:
        choices = []
        for i, c in enumerate(self.choices):
            message: Dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None}
            if self.calls(i):
                message["content"] = c.text or None
                message["tool_calls"] = self.calls(i)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": {"content": self.logprobs[i], "refusal": None} if self.logprobs is not None else None,
                    "finish_reason": c.finish_reason,
                }
            )
        return completion_body(
            id=self.id,
            model=self.model,
            created=self.created,
            fingerprint=self.snapshot.fingerprint,
            choices=choices,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
        )

    def chunks(self) -> List[Dict[str, Any]]:
        """The response as ``chat.completion.chunk`` objects (one content delta per token)."""
        usage_field = {"usage": None} if self.request.include_usage else {}

        def chunk(choice: Dict[str, Any]) -> Dict[str, Any]:
            body = chunk_body(id=self.id, model=self.model, created=self.created, fingerprint=self.snapshot.fingerprint, choices=[choice])
            body.update(usage_field)
            return body

        out = []
        for i, c in enumerate(self.choices):
            out.append(chunk(choice_delta(i, {"role": "assistant", "content": ""})))
            if self.calls(i) or c.text != "".join(c.pieces):  # tool calls (or a prefilled text): whole values
                if c.text:
                    out.append(chunk(choice_delta(i, {"content": c.text})))
                for k, call in enumerate(self.calls(i) or []):
                    head = {"index": k, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": ""}}
                    out.append(chunk(choice_delta(i, {"tool_calls": [head]})))
                    out.append(chunk(choice_delta(i, {"tool_calls": [{"index": k, "function": {"arguments": call["function"]["arguments"]}}]})))
                out.append(chunk(choice_delta(i, {}, finish_reason=c.finish_reason)))
                continue
            for k, piece in enumerate(c.pieces):
                if not piece and self.logprobs is None:
                    continue
                lp = {"content": [self.logprobs[i][k]], "refusal": None} if self.logprobs is not None else None
                out.append(chunk(choice_delta(i, {"content": piece}, logprobs=lp)))
            out.append(chunk(choice_delta(i, {}, finish_reason=c.finish_reason)))
        if self.request.include_usage:
            out.append(
                chunk_body(
                    id=self.id,
                    model=self.model,
                    created=self.created,
                    fingerprint=self.snapshot.fingerprint,
                    choices=[],
                    usage=usage_body(self.prompt_tokens, self.completion_tokens),
                )
            )
        return out


class ChatService:
    """Turns validated requests into :class:`Completion` objects."""

    def __init__(self, source: ModelSource, limits: Optional[Limits] = None):
        self.source = source
        self.limits = limits or Limits()
        self._text: Dict[int, TokenText] = {}
        self._native: Dict[int, bool] = {}  # tokenizer -> whether its template renders tools itself

    def token_text(self, tokenizer: Any) -> TokenText:
        key = id(tokenizer)
        if key not in self._text:
            self._text[key] = TokenText(tokenizer)
        return self._text[key]

    def snapshot_for(self, model: str) -> Snapshot:
        if not self.source.accepts(model):
            raise APIError(404, f"The model '{model}' does not exist; this server serves '{self.source.name}'.", param="model", code="model_not_found")
        return self.source.current()

    def can_stream_live(self, req: ChatRequest) -> bool:
        """Whether ``req`` can be streamed token by token (:mod:`rlkit.serve.live`): the client takes
        an ``on_token`` listener and no logprobs are asked for (they may need a rescoring pass)."""
        return not req.logprobs and not req.uses_tools and accepts_on_token(self.snapshot_for(req.model).client)

    def render(self, snapshot: Snapshot, req: ChatRequest) -> List[int]:
        from rlkit.chat import prompt_tokens
        from rlkit.tools.render import ToolRenderer

        tokenizer = snapshot.client.get_tokenizer()
        try:
            if req.uses_tools:
                renderer = ToolRenderer(tokenizer, req.tools)
                self._native[id(tokenizer)] = renderer.native
                return renderer.prompt(req.messages, prefill=prefill_for(forced_choice(req.tool_choice, req.tools), renderer.native))
            return prompt_tokens(tokenizer, req.messages)
        except Exception as exc:  # noqa: BLE001 - a template that refuses these messages
            raise bad_request(f"The model's chat template cannot render these messages: {exc}", "messages") from None

    def tool_calls(self, req: ChatRequest, choices: List[ChoiceText], tokenizer: Any) -> List[Optional[List[Dict[str, Any]]]]:
        """Parse each choice's text into tool calls (in place: content and finish reason follow)."""
        out: List[Optional[List[Dict[str, Any]]]] = []
        prefill = prefill_for(forced_choice(req.tool_choice, req.tools), self._native.get(id(tokenizer), False))
        for c in choices:
            result = tool_choice_result(c.text, prefill, req.tools, req.tool_choice, c.finish_reason, parallel=req.parallel_tool_calls)
            c.text, c.finish_reason = result.content or "", result.finish_reason
            out.append(result.tool_calls)
        return out

    def constraint(self, req: ChatRequest, native: bool = False) -> Optional[Constraint]:
        """What the completion is decoded under: a forced tool call's grammar, else ``response_format``'s schema."""
        forced = tool_constraint(req.tools, forced_choice(req.tool_choice, req.tools), native) if req.tools else None
        if forced is not None:
            return forced
        return Constraint(json_schema=req.response_format) if req.response_format is not None else None

    def sampling_params(self, req: ChatRequest, prompt_len: int, window: Optional[int], native: bool = False) -> SamplingParams:
        room = None if window is None else window - prompt_len
        if room is not None and room < 1:
            raise APIError(400, f"This model's maximum context length is {window} tokens; the messages use {prompt_len}.", param="messages", code="context_length_exceeded")
        if req.max_tokens is None:
            max_tokens = self.limits.default_max_tokens if room is None else min(self.limits.default_max_tokens, room)
        else:
            max_tokens = req.max_tokens
            if room is not None and max_tokens > room:
                raise APIError(
                    400,
                    f"This model's maximum context length is {window} tokens. However, you requested {prompt_len + max_tokens} tokens "
                    f"({prompt_len} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
                    param="messages",
                    code="context_length_exceeded",
                )
        top_p, top_k = req.top_p, req.top_k
        if top_p == 0:  # OpenAI accepts top_p=0: only the most likely token
            top_p, top_k = None, 1
        return SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_p=top_p, top_k=top_k, seed=req.seed, stop=req.stop or None,
            constraint=self.constraint(req, native),
        )

    async def complete(self, req: ChatRequest) -> Completion:
        snapshot = self.snapshot_for(req.model)
        client = snapshot.client
        tt = self.token_text(client.get_tokenizer())
        prompt = self.render(snapshot, req)
        native = self._native.get(id(client.get_tokenizer()), False)
        params = self.sampling_params(req, len(prompt), context_window(client), native)
        try:
            response = await client.sample(prompt, num_samples=req.n, sampling_params=params)
        except InvalidInputError as exc:
            raise bad_request(str(exc), None) from None
        except RlkitError as exc:
            raise APIError(500, f"sampling failed: {exc}", type="server_error", code=None) from None
        choices = [
            finish_choice(tt, s.tokens, s.logprobs, s.stop_reason == StopReason.STOP, req.stop) for s in response.sequences
        ]
        logprobs = await self._logprobs(client, tt, prompt, choices, req) if req.logprobs else None
        calls = self.tool_calls(req, choices, client.get_tokenizer()) if req.tools else []
        usage = response.usage
        prompt_tokens = usage.prefill_tokens or len(prompt)
        completion_tokens = usage.decode_tokens or sum(c.generated for c in choices)
        return Completion(
            id=new_id(),
            created=int(time.time()),
            model=self.source.name,
            snapshot=snapshot,
            request=req,
            choices=choices,
            logprobs=logprobs,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            tool_calls=calls,
        )

    async def _logprobs(self, client: Any, tt: TokenText, prompt: List[int], choices: List[ChoiceText], req: ChatRequest) -> List[List[Dict[str, Any]]]:
        raw = req.temperature in (None, 0, 1) or req.top_k == 1 or req.top_p == 0
        if raw and not req.top_logprobs:
            return [[logprob_entry(tt, t, lp) for t, lp in zip(c.tokens, c.logprobs)] for c in choices]
        scored = await asyncio.gather(*(self._score(client, prompt, c.tokens, req.top_logprobs) for c in choices))
        out = []
        for c, (values, tops) in zip(choices, scored):
            out.append([logprob_entry(tt, t, lp, top) for t, lp, top in zip(c.tokens, values, tops)])
        return out

    async def _score(self, client: Any, prompt: List[int], tokens: List[int], k: int) -> Tuple[List[float], List[List[tuple]]]:
        """Raw (temperature 1) logprobs of ``tokens`` after ``prompt``, and the top ``k`` alternatives."""
        if not tokens:
            return [], []
        try:
            response = await client.sample(
                prompt + tokens,
                num_samples=1,
                sampling_params=SamplingParams(max_tokens=1, temperature=0),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=k or None,
            )
        except InvalidInputError:  # prompt + completion fill the context: no room to sample; score only
            values = await client.compute_logprobs(prompt + tokens)
            return [float(v) for v in values[len(prompt):]], [[] for _ in tokens]
        values = [float(v) for v in response.prompt_logprobs[len(prompt):]]
        if k:
            tops = [[(t.token_id, t.logprob) for t in top] for top in response.topk_prompt_logprobs[len(prompt):]]
        else:
            tops = [[] for _ in tokens]
        return values, tops
