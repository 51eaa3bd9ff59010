"""``rlkit endpoint check``: measure which chat-completions parameters an endpoint really honours.

"OpenAI-compatible" usually means the routes and the JSON shape; whether ``stop`` is honoured,
``seed`` reproduces, ``max_tokens`` is respected or ``usage`` is right is another matter. Each probe
sends a few small requests over plain HTTP (``httpx``, so the raw status codes and bodies are
seen) and compares behaviour, not just shape:

==================  ============================================================================
models              ``GET /v1/models`` lists the model
basic               a plain request returns a well-formed ``chat.completion``
temperature_0       three requests at temperature 0 return the same text
max_tokens          ``max_tokens`` and ``max_completion_tokens`` cap the completion (usage and text)
stop                a stop sequence taken from the greedy text cuts it exactly there, excluded
n                   ``n=3`` returns three choices indexed 0..2
seed                the same seed reproduces a temperature-1 sample; another seed changes it
top_p               ``top_p`` ~ 0 at temperature 1 gives the greedy text
logprobs            ``logprobs`` / ``top_logprobs``: one entry per token, k alternatives, greedy = top-1
stream              SSE chunks + ``[DONE]``; the deltas add up to the non-streamed greedy text
usage               totals add up; a length-capped completion counts exactly ``max_tokens``; n
                    choices count n times; ``prompt_tokens`` matches our own count of the chat
                    template (``--tokenizer``) or at least grows with the prompt
tools               ``tools`` are accepted and every returned ``tool_calls`` entry is well-formed (id,
                    ``type: function``, a known name, JSON-object arguments fitting the tool's
                    schema); ``tool`` messages answering an assistant ``tool_calls`` turn are
                    accepted; a forced call (``tool_choice`` naming the function, at temperature 0
                    and over 3 seeds at 1), ``tool_choice="required"`` and the named call streamed
                    (its deltas assemble to schema-valid JSON) come back as ``tool_calls`` with
                    ``finish_reason: "tool_calls"`` (partial when the model answers in text instead)
response_format     ``json_schema``: the content parses and fits the schema (at temperature 0 and 1);
                    a schema that cannot be compiled is a 400 with an error body naming where in it
errors              malformed requests get 4xx with OpenAI's ``{"error": {message, type, ...}}``
auth                (with an API key) no key / a wrong key get 401 with an error body
==================  ============================================================================

Each result is ``pass``, ``partial``, ``fail`` or ``skip`` with a one-line detail.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

PROMPT = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]
LONGER_PROMPT = [{"role": "user", "content": "Count from one to twenty in words, separated by commas. Then count back down to one."}]
BASE_TOKENS = 24
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}
TOOL_PROMPT = [{"role": "user", "content": "What is the weather in Oslo?"}]
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
                 "required": ["answer", "unit"], "additionalProperties": False}
BAD_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integr"}}}


@dataclass
class ProbeResult:
    name: str
    status: str  # pass | partial | fail | skip
    detail: str


class Endpoint:
    """A thin HTTP client for one base URL (``.../v1``)."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 120.0):
        import httpx

        self.base_url = normalize_url(base_url)
        self.api_key = api_key
        self.http = httpx.Client(timeout=timeout)

    def headers(self, api_key: Optional[str] = "default") -> Dict[str, str]:
        key = self.api_key if api_key == "default" else api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def get(self, path: str) -> Any:
        return self.http.get(self.base_url + path, headers=self.headers())

    def post(self, body: Any, *, api_key: Optional[str] = "default", raw: Optional[bytes] = None) -> Any:
        headers = {**self.headers(api_key), "content-type": "application/json"}
        content = raw if raw is not None else json.dumps(body).encode()
        return self.http.post(self.base_url + "/chat/completions", content=content, headers=headers)

    def stream(self, body: Dict[str, Any]) -> Tuple[int, str, List[str]]:
        """Status, content type, and the ``data:`` payloads of a streamed request."""
        headers = {**self.headers(), "content-type": "application/json"}
        data: List[str] = []
        with self.http.stream("POST", self.base_url + "/chat/completions", content=json.dumps(body).encode(), headers=headers) as r:
            ctype = r.headers.get("content-type", "")
            if r.status_code != 200 or "text/event-stream" not in ctype:
                r.read()
                return r.status_code, ctype, [r.text]
            for line in r.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
        return 200, ctype, data

    def close(self) -> None:
        self.http.close()


def normalize_url(url: str) -> str:
    """The base URL an OpenAI client takes: a bare ``http://host:port`` gets ``/v1`` appended."""
    from urllib.parse import urlparse

    url = url.rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if urlparse(url).path in ("", "/"):
        url += "/v1"
    return url


class Checker:
    """Runs the probes against one endpoint and model."""

    def __init__(self, endpoint: Endpoint, model: Optional[str] = None, tokenizer: Any = None, log: Optional[Callable[[str], None]] = None):
        self.ep = endpoint
        self.model = model
        self.tokenizer = tokenizer
        self.log = log or (lambda _m: None)
        self.results: List[ProbeResult] = []
        self._cache: Dict[str, Any] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def chat(self, **params: Any) -> Tuple[int, Any]:
        body = {"model": self.model, "messages": params.pop("messages", PROMPT), **params}
        r = self.ep.post(body)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def ok(self, **params: Any) -> Dict[str, Any]:
        status, body = self.chat(**params)
        if status != 200 or not isinstance(body, dict) or not body.get("choices"):
            raise ProbeFailure(f"HTTP {status}: {_short(body)}")
        return body

    def greedy(self, max_tokens: int = BASE_TOKENS) -> Dict[str, Any]:
        key = f"greedy{max_tokens}"
        if key not in self._cache:
            self._cache[key] = self.ok(temperature=0, max_tokens=max_tokens)
        return self._cache[key]

    # -- probes ------------------------------------------------------------------------------------
    def probe_models(self) -> ProbeResult:
        r = self.ep.get("/models")
        if r.status_code != 200:
            if self.model:
                return ProbeResult("models", "fail", f"GET /models: HTTP {r.status_code}")
            raise ProbeFailure(f"GET /models: HTTP {r.status_code} and no --model given")
        ids = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
        if not self.model:
            if not ids:
                raise ProbeFailure("GET /models lists no model and no --model given")
            self.model = ids[0]
        if self.model in ids:
            return ProbeResult("models", "pass", f"lists {', '.join(map(str, ids[:3]))}")
        return ProbeResult("models", "partial", f"{self.model!r} not in the list {ids[:3]}")

    def probe_basic(self) -> ProbeResult:
        body = self.greedy()
        problems = []
        if body.get("object") != "chat.completion":
            problems.append(f"object={body.get('object')!r}")
        msg = body["choices"][0].get("message") or {}
        if msg.get("role") != "assistant" or not isinstance(msg.get("content"), str):
            problems.append("message lacks role=assistant / string content")
        if body["choices"][0].get("finish_reason") not in ("stop", "length"):
            problems.append(f"finish_reason={body['choices'][0].get('finish_reason')!r}")
        if not isinstance(body.get("id"), str):
            problems.append("no id")
        return ProbeResult("basic", "fail" if problems else "pass", "; ".join(problems) or "well-formed chat.completion")

    def probe_temperature_0(self) -> ProbeResult:
        texts = [_text(self.greedy())] + [_text(self.ok(temperature=0, max_tokens=BASE_TOKENS)) for _ in range(2)]
        self._cache["deterministic"] = len(set(texts)) == 1
        if len(set(texts)) == 1:
            return ProbeResult("temperature_0", "pass", "3 identical greedy completions")
        return ProbeResult("temperature_0", "fail", f"{len(set(texts))} different texts from 3 greedy requests")

    def probe_max_tokens(self) -> ProbeResult:
        details, passed = [], 0
        base = self.greedy()
        full, full_finish = _text(base), base["choices"][0].get("finish_reason")
        for param in ("max_tokens", "max_completion_tokens"):
            status, body = self.chat(temperature=0, **{param: 4})
            if status != 200 or not isinstance(body, dict) or not body.get("choices"):
                details.append(f"{param}: HTTP {status}")
                continue
            used = (body.get("usage") or {}).get("completion_tokens")
            text, finish = _text(body), body["choices"][0].get("finish_reason")
            # don't take usage's word for it: the text must be short too (a prefix of the greedy
            # text where greedy decoding is deterministic, else well under the 24-token text)
            if self._cache.get("deterministic"):
                text_ok = full.startswith(text) and (len(text) < len(full) or full_finish != "length")
            else:
                text_ok = len(text) <= 0.5 * len(full) or len(full) < 8
            honoured = text_ok and (used is None or used <= 4)
            if honoured and (finish == "length" or used is not None and used < 4):
                passed += 1
                details.append(f"{param}: ok")
            else:
                details.append(f"{param}: {used} tokens, finish_reason={finish!r}, {len(text)} chars")
        status = "pass" if passed == 2 else "partial" if passed else "fail"
        return ProbeResult("max_tokens", status, "; ".join(details))

    def probe_stop(self) -> ProbeResult:
        full = _text(self.greedy())
        if len(full) < 3:
            return ProbeResult("stop", "skip", f"greedy text too short to probe ({full!r})")
        # a 2-character stop sequence from the middle of the greedy text, preferring one whose
        # first occurrence is not at the very start (so the cut text is not empty)
        candidates = [full[k : k + 2] for k in list(range(len(full) // 2, len(full) - 1)) + list(range(1, len(full) // 2))]
        stop = next((s for s in candidates if full.find(s) > 0), candidates[0])
        expected = full[: full.find(stop)]
        body = self.ok(temperature=0, max_tokens=BASE_TOKENS, stop=[stop])
        text, finish = _text(body), body["choices"][0].get("finish_reason")
        if text == expected and finish == "stop":
            return ProbeResult("stop", "pass", f"cut before {stop!r} ({len(expected)} chars), finish_reason='stop'")
        if text == expected:
            return ProbeResult("stop", "partial", f"cut at {stop!r} but finish_reason={finish!r}")
        if text.startswith(expected + stop) and len(text) <= len(expected) + len(stop) + 1:
            return ProbeResult("stop", "partial", f"stopped at {stop!r} but returned the stop sequence")
        return ProbeResult("stop", "fail", f"stop={stop!r}: expected {expected!r}, got {text[:40]!r}")

    def probe_n(self) -> ProbeResult:
        body = self.ok(temperature=1, max_tokens=8, n=3)
        self._cache["n3"] = body
        indices = sorted(c.get("index") for c in body["choices"])
        if indices == [0, 1, 2]:
            distinct = len({_text(body, i) for i in range(3)})
            return ProbeResult("n", "pass", f"3 choices ({distinct} distinct at temperature 1)")
        if len(body["choices"]) == 1:
            return ProbeResult("n", "fail", "n=3 returned one choice")
        return ProbeResult("n", "partial", f"n=3 returned indices {indices}")

    def probe_seed(self) -> ProbeResult:
        def sample(seed: int) -> str:
            return _text(self.ok(temperature=1, max_tokens=16, seed=seed))

        a, b, c = sample(1234), sample(1234), sample(4321)
        if a == b and a != c:
            return ProbeResult("seed", "pass", "same seed reproduces; another seed differs")
        if a == b:
            return ProbeResult("seed", "partial", "same seed reproduces, but so does another seed (is temperature ignored?)")
        return ProbeResult("seed", "fail", "the same seed gave different samples")

    def probe_top_p(self) -> ProbeResult:
        greedy = _text(self.greedy())
        texts = [_text(self.ok(temperature=1, top_p=1e-6, max_tokens=BASE_TOKENS, seed=s)) for s in (1, 2)]
        if all(t == greedy for t in texts):
            return ProbeResult("top_p", "pass", "top_p~0 at temperature 1 gives the greedy text")
        return ProbeResult("top_p", "fail", "top_p~0 at temperature 1 does not give the greedy text")

    def probe_logprobs(self) -> ProbeResult:
        status, body = self.chat(temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
        if status != 200 or not isinstance(body, dict) or not body.get("choices"):
            return ProbeResult("logprobs", "fail", f"HTTP {status}: {_short(body)}")
        self._cache["logprobs"] = body
        content = ((body["choices"][0].get("logprobs") or {}).get("content")) or []
        if not content:
            return ProbeResult("logprobs", "fail", "no logprobs.content in the response")
        problems = []
        if any(not isinstance(e.get("logprob"), (int, float)) or e["logprob"] > 1e-4 for e in content):
            problems.append("a logprob is missing or > 0")
        if any(len(e.get("top_logprobs") or []) != 2 for e in content):
            problems.append("top_logprobs does not hold 2 alternatives per token")
        elif any(e["logprob"] < max(t["logprob"] for t in e["top_logprobs"]) - 1e-3 for e in content):
            problems.append("a greedy token is not the most likely alternative")
        if "".join(e.get("token", "") for e in content) != _text(body):
            problems.append("tokens do not spell the text")
        if not problems:
            return ProbeResult("logprobs", "pass", f"{len(content)} tokens with 2 alternatives each; greedy = top-1")
        return ProbeResult("logprobs", "partial", "; ".join(problems))

    def probe_stream(self) -> ProbeResult:
        body = {"model": self.model, "messages": PROMPT, "temperature": 0, "max_tokens": BASE_TOKENS, "stream": True, "stream_options": {"include_usage": True}}
        status, ctype, data = self.ep.stream(body)
        if status != 200 or "text/event-stream" not in ctype:
            return ProbeResult("stream", "fail", f"HTTP {status}, content-type {ctype!r}")
        if not data or data[-1] != "[DONE]":
            return ProbeResult("stream", "fail", "the stream does not end with [DONE]")
        text, finish, usage, problems = "", None, None, []
        for payload in data[:-1]:
            chunk = json.loads(payload)
            if chunk.get("object") != "chat.completion.chunk":
                problems.append(f"object={chunk.get('object')!r}")
                break
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
                finish = choice.get("finish_reason") or finish
        expected = _text(self.greedy())
        if text != expected:
            problems.append(f"streamed text differs from the non-streamed one ({len(text)} vs {len(expected)} chars)")
        if finish not in ("stop", "length"):
            problems.append("no finish_reason")
        chunks = len(data) - 1
        if problems:
            return ProbeResult("stream", "partial", "; ".join(problems))
        return ProbeResult("stream", "pass", f"{chunks} chunks + [DONE]; {'usage chunk' if usage else 'no usage chunk (include_usage)'}")

    def probe_usage(self) -> ProbeResult:
        body = self.greedy()
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return ProbeResult("usage", "fail", "no usage in the response")
        checks, problems = [], []
        p, c, t = usage.get("prompt_tokens"), usage.get("completion_tokens"), usage.get("total_tokens")
        if not all(isinstance(x, int) for x in (p, c, t)):
            return ProbeResult("usage", "fail", f"usage fields are not integers: {usage}")
        (checks if p + c == t else problems).append("total = prompt + completion" if p + c == t else f"total {t} != {p} + {c}")
        if body["choices"][0].get("finish_reason") == "length":
            (checks if c == BASE_TOKENS else problems).append(f"completion_tokens {c} {'=' if c == BASE_TOKENS else '!='} max_tokens {BASE_TOKENS}")
        n3 = self._cache.get("n3")
        if n3 and all(ch.get("finish_reason") == "length" for ch in n3["choices"]) and len(n3["choices"]) == 3:
            got = (n3.get("usage") or {}).get("completion_tokens")
            (checks if got == 3 * 8 else problems).append(f"n=3 x 8 tokens counted {got}")
        lp = self._cache.get("logprobs")
        if lp:
            n_lp = len(((lp["choices"][0].get("logprobs") or {}).get("content")) or [])
            got = (lp.get("usage") or {}).get("completion_tokens")
            eos = 1 if lp["choices"][0].get("finish_reason") == "stop" else 0
            if n_lp and got is not None:
                (checks if got in (n_lp, n_lp + eos) else problems).append(f"completion_tokens {got} vs {n_lp} logprob entries")
        if self.tokenizer is not None:
            expected = count_prompt_tokens(self.tokenizer, PROMPT)
            (checks if p == expected else problems).append(f"prompt_tokens {p} {'=' if p == expected else '!='} {expected} counted with the chat template")
        else:
            longer = (self.ok(temperature=0, max_tokens=1, messages=LONGER_PROMPT).get("usage") or {}).get("prompt_tokens")
            (checks if isinstance(longer, int) and longer > p else problems).append(f"prompt_tokens grows with the prompt ({p} -> {longer})")
        if problems:
            return ProbeResult("usage", "partial" if checks else "fail", "; ".join(problems))
        return ProbeResult("usage", "pass", "; ".join(checks))

    def probe_errors(self) -> ProbeResult:
        cases = [
            ("no messages", {"model": self.model}, 400),
            ("temperature='hot'", {"model": self.model, "messages": PROMPT, "temperature": "hot"}, 400),
            ("max_tokens=-1", {"model": self.model, "messages": PROMPT, "max_tokens": -1}, 400),
            ("invalid JSON", None, 400),
            ("unknown model", {"model": "no-such-model-rlkit-probe", "messages": PROMPT, "max_tokens": 1}, 404),
        ]
        good, problems = 0, []
        for label, body, want in cases:
            r = self.ep.post(body, raw=b"{not json" if body is None else None)
            shaped = _error_shaped(r)
            if r.status_code == want and shaped:
                good += 1
            elif 400 <= r.status_code < 500 and shaped:
                good += 1
                problems.append(f"{label}: HTTP {r.status_code} (OpenAI: {want})")
            else:
                problems.append(f"{label}: HTTP {r.status_code}{'' if shaped else ', body not {error: {message, type}}'}")
        if good == len(cases) and not problems:
            return ProbeResult("errors", "pass", f"{len(cases)} bad requests: right status, OpenAI error body")
        return ProbeResult("errors", "partial" if good else "fail", "; ".join(problems))

    def probe_tools(self) -> ProbeResult:
        problems: List[str] = []

        def calls_of(body: Any, what: str) -> List[Dict[str, Any]]:
            if not isinstance(body, dict) or not body.get("choices"):
                problems.append(f"{what}: {_short(body)}")
                return []
            choice = body["choices"][0]
            calls = (choice.get("message") or {}).get("tool_calls") or []
            for c in calls:
                fn = c.get("function") or {}
                try:
                    args_ok = fits(json.loads(fn.get("arguments", "")), WEATHER_TOOL["function"]["parameters"])
                except (TypeError, ValueError):
                    args_ok = False
                if not (isinstance(c.get("id"), str) and c.get("type") == "function" and fn.get("name") in ("get_weather", "get_time") and args_ok):
                    problems.append(f"{what}: malformed tool call {_short(c)}")
            if calls and choice.get("finish_reason") != "tool_calls":
                problems.append(f"{what}: tool_calls with finish_reason={choice.get('finish_reason')!r}")
            return calls

        status, auto = self.chat(messages=TOOL_PROMPT, tools=[WEATHER_TOOL], temperature=0, max_tokens=48)
        if status != 200:
            return ProbeResult("tools", "fail", f"a request with tools: HTTP {status}: {_short(auto)}")
        calls_of(auto, "tool_choice=auto")
        history = TOOL_PROMPT + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_probe", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_probe", "content": "sunny, 21 C"}]
        status, answered = self.chat(messages=history, tools=[WEATHER_TOOL], temperature=0, max_tokens=16)
        if status != 200:
            problems.append(f"a tool message: HTTP {status}: {_short(answered)}")
        forced_choice = {"type": "function", "function": {"name": "get_weather"}}
        second = dict(WEATHER_TOOL, function=dict(WEATHER_TOOL["function"], name="get_time", description="The time in a city."))
        cases = [("forced call", dict(tool_choice=forced_choice, temperature=0)),
                 *[(f"forced call, seed {seed}", dict(tool_choice=forced_choice, temperature=1, seed=seed)) for seed in (1, 2, 3)],
                 ("tool_choice=required", dict(tool_choice="required", temperature=1, seed=4, tools=[WEATHER_TOOL, second]))]
        missed = []
        for what, params in cases:
            status, forced = self.chat(**{"messages": TOOL_PROMPT, "tools": [WEATHER_TOOL], "max_tokens": 48, **params})
            if status != 200:
                problems.append(f"{what}: HTTP {status}: {_short(forced)}")
            elif not calls_of(forced, what):
                missed.append(what)
        streamed = self._streamed_call(forced_choice)
        if streamed is not None:
            missed.append(streamed)
        if problems:
            return ProbeResult("tools", "fail", "; ".join(problems + missed))
        if missed:
            return ProbeResult("tools", "partial", "tools and tool messages accepted, but these came back without a "
                               "schema-valid call: " + ", ".join(missed))
        return ProbeResult("tools", "pass", "tools and tool messages accepted; forced (named, 3 seeds), required and "
                           "streamed calls return schema-valid tool_calls")

    def _streamed_call(self, choice: Dict[str, Any]) -> Optional[str]:
        """``None`` when the named call, streamed, assembles to a schema-valid call, else why not."""
        body = {"model": self.model, "messages": TOOL_PROMPT, "tools": [WEATHER_TOOL], "tool_choice": choice,
                "temperature": 1, "seed": 5, "max_tokens": 48, "stream": True}
        status, _ctype, data = self.ep.stream(body)
        if status != 200:
            return f"streamed call (HTTP {status})"
        calls: Dict[Any, List[str]] = {}  # index -> [name, arguments], assembled from the deltas
        for payload in data:
            if payload == "[DONE]":
                break
            for c in json.loads(payload).get("choices") or []:
                for call in (c.get("delta") or {}).get("tool_calls") or []:
                    fn, entry = call.get("function") or {}, calls.setdefault(call.get("index"), ["", ""])
                    entry[0] += fn.get("name") or ""
                    entry[1] += fn.get("arguments") or ""
        try:
            ok = bool(calls) and all(n == "get_weather" and fits(json.loads(a), WEATHER_TOOL["function"]["parameters"])
                                     for n, a in calls.values())
        except ValueError:
            ok = False
        return None if ok else "streamed call"

    def probe_response_format(self) -> ProbeResult:
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True}}
        problems = []
        for temperature, seed in ((0, None), (1, 7)):
            status, body = self.chat(messages=PROMPT, response_format=fmt, temperature=temperature, seed=seed, max_tokens=48)
            if status != 200:
                return ProbeResult("response_format", "fail", f"json_schema: HTTP {status}: {_short(body)}")
            try:
                ok = fits(json.loads(_text(body)), ANSWER_SCHEMA)
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"temperature {temperature}: content does not fit the schema: {_text(body)[:60]!r}")
        bad = dict(fmt, json_schema={"name": "bad", "schema": BAD_SCHEMA})
        r = self.ep.post({"model": self.model, "messages": PROMPT, "response_format": bad, "max_tokens": 8})
        named = _error_shaped(r) and "properties" in json.dumps(r.json()["error"])
        if r.status_code != 400 or not named:
            problems.append(f"a schema that cannot be compiled: HTTP {r.status_code}{'' if named else ', the error does not say where'}")
        if problems:
            return ProbeResult("response_format", "partial", "; ".join(problems))
        return ProbeResult("response_format", "pass", "json_schema content fits the schema; a bad schema is a 400 naming where")

    def probe_auth(self) -> ProbeResult:
        if not self.ep.api_key:
            return ProbeResult("auth", "skip", "no API key given")
        body = {"model": self.model, "messages": PROMPT, "max_tokens": 1}
        results = [self.ep.post(body, api_key=None), self.ep.post(body, api_key="wrong-" + self.ep.api_key[:4])]
        if all(r.status_code == 401 and _error_shaped(r) for r in results):
            return ProbeResult("auth", "pass", "no key and a wrong key: 401 with an error body")
        return ProbeResult("auth", "fail", f"no key: HTTP {results[0].status_code}; wrong key: HTTP {results[1].status_code}")

    PROBES = ("models", "basic", "temperature_0", "max_tokens", "stop", "n", "seed", "top_p", "logprobs", "stream", "usage", "tools",
              "response_format", "errors", "auth")

    def run(self, only: Optional[List[str]] = None) -> List[ProbeResult]:
        for name in self.PROBES:
            if only and name not in only and name != "models":
                continue
            started = time.perf_counter()
            try:
                result = getattr(self, f"probe_{name}")()
            except ProbeFailure as exc:
                result = ProbeResult(name, "fail", str(exc))
                if name == "models":
                    self.results.append(result)
                    break
            except Exception as exc:  # noqa: BLE001 - a probe that crashes reports it, the others still run
                result = ProbeResult(name, "fail", f"{type(exc).__name__}: {exc}")
                if name == "models":  # nothing else can run (connection refused, ...)
                    self.results.append(result)
                    break
            self.log(f"{name}: {result.status} ({time.perf_counter() - started:.1f}s)")
            self.results.append(result)
        return self.results


class ProbeFailure(Exception):
    pass


def _text(body: Dict[str, Any], index: int = 0) -> str:
    choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
    if index >= len(choices):
        return ""
    return ((choices[index].get("message") or {}).get("content")) or ""


def fits(value: Any, schema: Dict[str, Any]) -> bool:
    """Whether ``value`` is valid under ``schema`` (``jsonschema`` when installed, else a check of
    types, ``enum``, ``required`` and ``additionalProperties: false``)."""
    try:
        import jsonschema
    except ImportError:
        return _fits(value, schema)
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def _fits(value: Any, schema: Dict[str, Any]) -> bool:
    kinds = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool, "null": type(None)}
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, kinds.get(kind, object)) or kind in ("integer", "number") and isinstance(value, bool)):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        if any(k not in value for k in schema.get("required") or []):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(_fits(v, props[k]) for k, v in value.items() if k in props)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(_fits(v, schema["items"]) for v in value)
    return True


def _short(body: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body)
    return text[:120]


def _error_shaped(response: Any) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    err = body.get("error") if isinstance(body, dict) else None
    return isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)


def count_prompt_tokens(tokenizer: Any, messages: List[Dict[str, str]]) -> int:
    from rlkit.chat import prompt_tokens

    return len(prompt_tokens(tokenizer, messages))


def load_tokenizer(name: str) -> Any:
    """An rlkit model name (``tiny``, ``smollm2-135m-instruct``) or a Hugging Face id / directory."""
    from rlkit.backends.local.models import load_tokenizer as rlkit_tokenizer

    return rlkit_tokenizer(name)


def check_endpoint(url: str, *, model: Optional[str] = None, api_key: Optional[str] = None, tokenizer: Any = None, timeout: float = 120.0,
                   only: Optional[List[str]] = None, log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Run every probe; return ``{"url", "model", "results": [{name, status, detail}], "summary"}``."""
    endpoint = Endpoint(url, api_key, timeout)
    try:
        checker = Checker(endpoint, model, tokenizer, log)
        results = checker.run(only)
    finally:
        endpoint.close()
    summary: Dict[str, int] = {}
    for r in results:
        summary[r.status] = summary.get(r.status, 0) + 1
    return {"url": endpoint.base_url, "model": checker.model, "results": [asdict(r) for r in results], "summary": summary}


def render_table(report: Dict[str, Any]) -> Any:
    """A rich table of a :func:`check_endpoint` report."""
    from rich.table import Table

    marks = {"pass": "[green]✓ pass[/]", "partial": "[yellow]~ partial[/]", "fail": "[red]✗ fail[/]", "skip": "[dim]- skip[/]"}
    table = Table(title=f"{report['url']}  model={report['model']}", title_justify="left")
    table.add_column("probe")
    table.add_column("result")
    table.add_column("detail", overflow="fold")
    for r in report["results"]:
        table.add_row(r["name"], marks.get(r["status"], r["status"]), r["detail"])
    return table
