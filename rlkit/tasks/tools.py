"""A tool environment around any task: the model may call tools, then answers; the task grades the answer.

``ToolTask(task={...}, tools=["calculator"], max_tool_calls=2)`` wraps a task that has
``problems(split)``, ``messages(problem)`` and a ``reward`` callable ``(completion, problem)``
(arithmetic and GSM8K do; the code task grades inside its own environment and cannot be wrapped).
Config: ``train.task: {name: tools, task: {name: arithmetic, ...}, tools: [calculator], ...}``.

**An episode** (:class:`ToolEnv`), one ``Env.step`` per assistant turn:

1. the prompt is the inner task's messages rendered with the tool schemas
   (:class:`~rlkit.tools.ToolRenderer`: the template's own tool format, or the ChatML fallback);
2. the sampled turn is parsed (:func:`~rlkit.tools.parse_tool_calls`, strict). With no call — or
   once ``max_tool_calls`` calls have been made — it is the answer: ``reward = task.reward(answer,
   problem)`` (+ shaping), done. Otherwise every call is run (:func:`~rlkit.tools.run_tool`:
   timeouts, output limits; failures and malformed calls come back as ``Error: ...`` tool messages,
   each counting towards ``max_tool_calls``) and the next observation is the rest of the turn, the
   tool turns and the next assistant header (:meth:`~rlkit.tools.ToolRenderer.continuation`) — the
   sampled tokens are kept, never decoded and re-encoded. Set ``train.rollout.max_turns`` to at
   least ``max_tool_calls + 1``; an episode the collector cuts off earlier scores 0.

**Shaping** (optional, ``call_reward`` = w): ``+ w * well_formed / attempted`` calls when the
episode attempted any (default w = 0: only the task's grade counts).

**Metrics** (every transition carries the running totals; the RL loop logs their means per step
as ``reward/<name>``): ``tool_calls`` (well-formed calls run), ``malformed_calls``, ``tool_errors``
(calls that ran and failed: bad arguments, an exception, a timeout), ``over_budget`` (calls
attempted after the budget), ``turns``, ``used_tool`` (0/1); on the final turn the task's own
metrics (e.g. ``correct``) and ``correct_with_tool`` / ``correct_without_tool`` (so success given
a tool call = ``correct_with_tool / used_tool``).

**SFT warm start** (``loop: task_sft``): when the inner task offers ``tool_demonstration(problem)``
(``{"calls": [{"name", "arguments"}], "answer": str}``; arithmetic does), :meth:`ToolTask.reference_tokens`
renders the demonstration conversation — the calls, their real results from the same tools, the
answer — and trains on its assistant turns, in exactly the format the RL episodes sample.

**History** (``strip_reasoning``): by default the context of later turns is the sampled history,
unchanged. With ``strip_reasoning: true`` the ``<think>...</think>`` blocks of earlier turns are
removed from the context of later ones (as Qwen3-style templates do); the next turn's context is
then rendered afresh (``StepResult.next_context``) and each turn is trained in the context it was
sampled in, so trained tokens are still the sampled tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from rlkit.errors import ConfigError, DataError
from rlkit.rewards.base import as_result
from rlkit.tasks.base import Env, EnvGroup, Problem, StepResult, Task, build_task
from rlkit.tools.base import FunctionTool, Tool, run_tool
from rlkit.tools.builtin import Calculator, PythonTool
from rlkit.tools.render import ToolCall, ToolRenderer

BUILTIN_TOOLS = {"calculator": Calculator, "python": PythonTool}
_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
SYSTEM_PROMPT = "Use the tools when they help. Answer with the final result only."


def build_tool(spec: Union[str, Mapping[str, Any], Tool, Any]) -> Tool:
    """A tool from ``"calculator"`` / ``"python"``, ``{name: ..., **options}``, ``{_target_: "module:attr", ...}``
    (a :class:`Tool` subclass or a documented callable), a :class:`Tool`, or a callable."""
    from rlkit.imports import lookup

    if isinstance(spec, Tool):
        return spec
    if callable(spec) and not isinstance(spec, type):
        return FunctionTool(spec)
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"task.tools: {spec!r} is not a tool name, a mapping or a callable")
    options = dict(spec)
    where = "task.tools" if options.get("_target_") is not None else f"task.tools.{options.get('name')}"
    target = lookup(options, BUILTIN_TOOLS, "task.tools", "tool", keep_name=True)
    try:
        if isinstance(target, type) and issubclass(target, Tool):
            return target(**options)
        return FunctionTool(target, **options)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


class ToolTask(Task):
    """Any task, with tools (see the module docstring)."""

    name = "tools"

    def __init__(
        self,
        task: Union[Mapping[str, Any], Any],
        tools: Sequence[Any] = ("calculator",),
        max_tool_calls: int = 2,
        system_prompt: Optional[str] = SYSTEM_PROMPT,
        call_reward: float = 0.0,
        strip_reasoning: bool = False,
        mode: str = "auto",
    ):
        self.inner: Task = build_task(task) if isinstance(task, Mapping) else task
        if not isinstance(self.inner, Task):
            raise ConfigError(f"task.task: {self.inner!r} is not a rlkit.tasks.Task")
        overrides = {m: getattr(type(self.inner), m) is not getattr(Task, m) for m in ("messages", "reward")}
        if not all(overrides.values()):
            self.inner.close()
            raise ConfigError(f"task.task: {self.inner.name!r} needs messages(problem) and reward(completion, problem) "
                              "to be wrapped with tools")
        if max_tool_calls < 0:
            raise ConfigError("task.max_tool_calls must be >= 0")
        self.tools = [build_tool(t) for t in tools]
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"task.tools: duplicate tool names {names}")
        self.max_tool_calls, self.system_prompt, self.call_reward = (
            int(max_tool_calls),
            system_prompt,
            float(call_reward),
        )
        self.strip_reasoning, self.mode = bool(strip_reasoning), mode
        self._renderers: Dict[int, ToolRenderer] = {}

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return self.inner.problems(split)

    def reward(self, completion: str, problem: Problem) -> Any:
        """The inner task's grade of a final answer."""
        return self.inner.reward(completion, problem)

    def prompt(self, problem: Problem, tokenizer: Any) -> List[int]:
        return self.renderer(tokenizer).prompt(self.messages(problem))

    def renderer(self, tokenizer: Any) -> ToolRenderer:
        key = id(tokenizer)
        if key not in self._renderers:
            self._renderers[key] = ToolRenderer(tokenizer, self.tools, mode=self.mode)
        return self._renderers[key]

    def messages(self, problem: Problem) -> List[Dict[str, Any]]:
        inner = [dict(m) for m in self.inner.messages(problem) or []]
        if not self.system_prompt:
            return inner
        if inner and inner[0]["role"] == "system":
            return [{"role": "system", "content": f"{inner[0]['content']}\n\n{self.system_prompt}"}] + inner[1:]
        return [{"role": "system", "content": self.system_prompt}] + inner

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> "ToolEnvGroup":
        messages = self.messages(problem)
        return ToolEnvGroup(self, problem, messages, self.prompt(problem, tokenizer), tokenizer)

    # -- the SFT warm start -------------------------------------------------------------------------
    @property
    def has_references(self) -> bool:
        """Whether the inner task offers tool demonstrations (implements ``tool_demonstration``)."""
        return type(self.inner).tool_demonstration is not Task.tool_demonstration

    def demonstration(self, problem: Mapping[str, Any]) -> List[Dict[str, Any]]:
        """The inner task's tool-use demonstration as a whole conversation, results from the real tools."""
        if not self.has_references:
            raise DataError(f"task {self.inner.name!r} has no tool_demonstration(problem) for an SFT warm start")
        demo = self.inner.tool_demonstration(problem)
        if demo is None:
            raise DataError(f"task {self.inner.name!r} gives no tool demonstration for problem {dict(problem)!r:.80}")
        by_name = {t.name: t for t in self.tools}
        calls = [ToolCall(c["name"], dict(c["arguments"]), id=f"call_{i}") for i, c in enumerate(demo["calls"])]
        convo = self.messages(problem)
        if calls:
            convo.append(ToolRenderer.assistant_message("", calls))
            for c in calls:
                if c.name not in by_name:
                    raise DataError(
                        f"tool demonstration calls {c.name!r}, which is not among the task's tools {sorted(by_name)}"
                    )
                convo.append(ToolRenderer.tool_message(c.id, c.name, run_tool(by_name[c.name], c.arguments).content))
        convo.append({"role": "assistant", "content": str(demo["answer"])})
        return convo

    def reference_tokens(self, problem: Mapping[str, Any], tokenizer: Any) -> tuple[List[int], List[float]]:
        """Tokens and weights (1 on the assistant turns) of :meth:`demonstration`."""
        rendered = self.renderer(tokenizer).render(self.demonstration(problem))
        end = self.renderer(tokenizer).end_of_turn
        tokens, weights = rendered.tokens, rendered.weights
        if end is not None:  # train through each turn's end-of-turn token, not the template's text after it
            weights = [w if (w == 0 or i == 0 or tokens[i - 1] != end) else 0.0 for i, w in enumerate(weights)]
        return tokens, weights

    def close(self) -> None:
        for t in self.tools:
            t.close()
        self.inner.close()


class ToolEnv(Env):
    """One episode (single use); see the module docstring."""

    def __init__(
        self,
        task: ToolTask,
        problem: Mapping[str, Any],
        messages: List[Dict[str, Any]],
        prompt: List[int],
        tokenizer: Any,
    ):
        self.task, self.problem, self.tokenizer = task, problem, tokenizer
        self.renderer = task.renderer(tokenizer)
        self.history: List[Dict[str, Any]] = [dict(m) for m in messages]
        self.prompt = list(prompt)
        self.counts = {"tool_calls": 0, "malformed_calls": 0, "tool_errors": 0, "over_budget": 0, "turns": 0}
        self.attempted = 0

    def initial_observation(self) -> List[int]:
        return list(self.prompt)

    def metrics(self) -> Dict[str, float]:
        return {**{k: float(v) for k, v in self.counts.items()}, "used_tool": float(self.counts["tool_calls"] > 0)}

    def step(self, action: List[int]) -> StepResult:
        self.counts["turns"] += 1
        text = self.tokenizer.decode(action, skip_special_tokens=True)
        parsed = self.renderer.parse(text)
        budget = self.task.max_tool_calls - self.attempted
        if parsed.attempted == 0 or budget <= 0:
            self.counts["over_budget"] += parsed.attempted
            return self._answer(parsed.content if parsed.attempted else text.strip())
        messages: List[Dict[str, Any]] = []
        by_name = {t.name: t for t in self.task.tools}
        attempts: List[Any] = list(parsed.calls) + list(parsed.errors)  # well-formed first, then the malformed
        for k, item in enumerate(attempts):
            if k >= budget:
                self.counts["over_budget"] += 1
                messages.append(ToolRenderer.tool_message("", "error", "Error: tool call budget exhausted; answer now"))
                continue
            self.attempted += 1
            if isinstance(item, ToolCall):
                outcome = run_tool(by_name[item.name], item.arguments)
                self.counts["tool_calls"] += 1
                self.counts["tool_errors"] += bool(outcome.error)
                messages.append(ToolRenderer.tool_message(item.id, item.name, outcome.content))
            else:
                self.counts["malformed_calls"] += 1
                messages.append(ToolRenderer.tool_message("", "error", f"Error: malformed tool call: {item}"))
        info = {"completion": text, "tool_messages": [m["content"] for m in messages]}
        if self.task.strip_reasoning and _THINK.search(text):
            self.history += [{"role": "assistant", "content": text}] + messages
            context = self.renderer.prompt([_without_reasoning(m) for m in self.history])
            return StepResult(reward=0.0, done=False, next_context=context, metrics=self.metrics(), info=info)
        observation = self.renderer.continuation(self.history, messages, action)
        self.history += [{"role": "assistant", "content": text}] + messages
        return StepResult(reward=0.0, done=False, next_observation=observation, metrics=self.metrics(), info=info)

    def _answer(self, answer: str) -> StepResult:
        result = as_result(self.task.reward(answer, self.problem))
        reward = float(result.reward)
        if self.task.call_reward and self.attempted:
            reward += self.task.call_reward * self.counts["tool_calls"] / self.attempted
        metrics = {**self.metrics(), **dict(result.metrics)}
        correct = float(metrics.get("correct", metrics.get("all_passed", float(result.reward >= 1.0))))
        metrics["correct_with_tool"] = correct * metrics["used_tool"]
        metrics["correct_without_tool"] = correct * (1.0 - metrics["used_tool"])
        return StepResult(reward=reward, done=True, metrics=metrics, info={"completion": answer, **result.info})


def _without_reasoning(message: Mapping[str, Any]) -> Dict[str, Any]:
    if message.get("role") != "assistant":
        return dict(message)
    return {**message, "content": _THINK.sub("", message.get("content") or "")}


@dataclass(eq=False)
class ToolEnvGroup(EnvGroup):
    """The G episodes of one problem (a :class:`ToolEnv` each, on these arguments); rewards per trajectory."""

    task: ToolTask
    problem: Mapping[str, Any]
    messages: List[Dict[str, Any]]
    prompt: List[int]
    tokenizer: Any

    def make_envs(self, n: int) -> List[ToolEnv]:
        return [ToolEnv(self.task, self.problem, self.messages, self.prompt, self.tokenizer) for _ in range(n)]
