"""Teachers for distillation: the teacher's own prompt rendering, scoring the student's tokens,
and turning the teacher's samples into student tokens.

A teacher is a sampling client — another base model, a checkpoint, or the student's own base model
— plus an optional context the student does not see (a system prompt, example turns). It always
reads a problem through **its own** chat template: ``teacher.prompt(messages, prefill)`` renders
``context + messages`` with the teacher's tokenizer, then appends the task's assistant prefill.

Scoring the student's completion (:meth:`Teacher.score`) gives one teacher logprob per student
token:

- **same vocabulary** (the usual case, including a different chat template or system prompt):
  the student's completion token ids are appended to the teacher's prompt unchanged, and
  ``compute_logprobs`` returns the teacher's logprob of each of them;
- **different vocabulary**: the completion's text is re-tokenised by the teacher (its end-of-turn
  token becomes the teacher's own), scored, and mapped back by character offsets: at every
  character position where both tokenisations have a token boundary, the teacher's summed logprob
  of the text in between is split evenly over the student tokens covering it, so the sum over the
  completion is exact and the per-token values are a local average. Text the teacher's tokenizer
  cannot reproduce exactly is refused with a one-line error naming the sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rlkit.chat import plain_tokens, prompt_tokens
from rlkit.errors import ConfigError, RlkitError

Messages = List[Dict[str, str]]


@dataclass
class TeacherConfig:
    """Who teaches: a base model or a checkpoint, and the context only the teacher sees."""

    base_model: Optional[str] = None  # null = the student's base model
    checkpoint: Optional[str] = None  # a checkpoint id (sampler or state); its base model is used
    system_prompt: Optional[str] = None  # the teacher's system prompt (merged with the task's, if any)
    context: List[Dict[str, str]] = field(default_factory=list)  # messages placed before the conversation (e.g. solved examples)


def open_teacher_sampler(service: Any, t: TeacherConfig, student_base_model: str) -> Any:
    """The teacher's sampling client; a checkpoint id that does not exist is a one-line error naming it."""
    if t.checkpoint:
        try:
            return service.create_sampling_client(model_package_arn=t.checkpoint)
        except RlkitError as exc:
            raise ConfigError(f"train.teacher.checkpoint={t.checkpoint!r}: {exc}") from None
    return service.create_sampling_client(base_model=t.base_model or student_base_model)


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def char_ends(tokenizer: Any, ids: Sequence[int], text: str) -> List[Optional[int]]:
    """For each token, the length of ``text`` covered once it is decoded; ``None`` where the prefix
    decoded so far is not a clean prefix of ``text`` (e.g. half of a multi-byte character)."""
    ends: List[Optional[int]] = []
    for i in range(1, len(ids) + 1):
        prefix = _decode(tokenizer, ids[:i])
        ends.append(len(prefix) if text.startswith(prefix) and not prefix.endswith("\ufffd") else None)
    return ends


def spread_by_characters(student_ends: Sequence[Optional[int]], teacher_ends: Sequence[Optional[int]], teacher_logprobs: Sequence[float]) -> List[float]:
    """Teacher logprobs (one per teacher token) mapped onto student tokens: between consecutive
    character positions where both tokenisations have a boundary, the teacher's sum is split evenly
    over the student tokens there. The total is preserved."""
    common = {e for e in student_ends if e is not None} & {e for e in teacher_ends if e is not None}
    cumulative: Dict[int, float] = {0: 0.0}
    running = 0.0
    for end, lp in zip(teacher_ends, teacher_logprobs):
        running += lp
        if end is not None and end in common:
            cumulative[end] = running
    out: List[float] = []
    segment: List[int] = []
    last = 0
    for i, end in enumerate(student_ends):
        segment.append(i)
        if end is not None and end in common and end > last or (i == len(student_ends) - 1):
            stop = end if end is not None and end in cumulative else max(cumulative)
            share = (cumulative[stop] - cumulative[last]) / len(segment)
            out += [share] * len(segment)
            segment, last = [], stop
    return out


def end_of_turn_id(tokenizer: Any) -> Optional[int]:
    """The token the chat template puts right after an assistant message's text."""
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    try:
        full = list(tokenizer.apply_chat_template(probe, tokenize=True, add_generation_prompt=False))
        if hasattr(full, "keys"):
            full = list(full["input_ids"])
        head = prompt_tokens(tokenizer, probe[:1]) + list(tokenizer.encode("ok", add_special_tokens=False))
        if full[: len(head)] == head and len(full) > len(head):
            return int(full[len(head)])
    except Exception:  # noqa: BLE001 - a template that cannot render the probe: fall back to eos
        pass
    return tokenizer.eos_token_id


class Scored:
    """A pending teacher score: ``result()`` -> one teacher logprob per student completion token."""

    def __init__(self, future: Any, finish):
        self.future, self.finish = future, finish

    def result(self) -> List[float]:
        return self.finish(list(self.future.result()))


class Teacher:
    """See the module docstring."""

    def __init__(self, sampler: Any, student_tokenizer: Any, config: TeacherConfig, *, name: str = "teacher"):
        self.sampler = sampler
        self.tokenizer = sampler.get_tokenizer()
        self.student_tokenizer = student_tokenizer
        self.system_prompt = config.system_prompt
        self.context: Messages = [dict(m) for m in (config.context or [])]
        self.name = name
        self.same_vocab = self.tokenizer is student_tokenizer or self.tokenizer.get_vocab() == student_tokenizer.get_vocab()
        self.same_template = self.same_vocab and getattr(self.tokenizer, "chat_template", None) == getattr(student_tokenizer, "chat_template", None)
        self.calls = 0
        if not self.same_vocab:
            self.end_id = end_of_turn_id(self.tokenizer)
            self.student_end_id = end_of_turn_id(student_tokenizer)
            self.student_specials = set(getattr(student_tokenizer, "all_special_ids", []) or [])
            self.teacher_specials = set(getattr(self.tokenizer, "all_special_ids", []) or [])

    @property
    def sees_student_prompt(self) -> bool:
        """Whether the teacher's prompt is token-for-token the student's (same template, no context)."""
        return self.same_template and not self.system_prompt and not self.context

    def messages(self, messages: Messages) -> Messages:
        """The teacher's conversation: its system prompt and context, then the problem's messages."""
        messages = [dict(m) for m in messages]
        head: Messages = []
        if self.system_prompt:
            if messages and messages[0]["role"] == "system":
                head = [{"role": "system", "content": f"{self.system_prompt}\n\n{messages.pop(0)['content']}"}]
            else:
                head = [{"role": "system", "content": self.system_prompt}]
        elif messages and messages[0]["role"] == "system":
            head = [messages.pop(0)]
        return head + self.context + messages

    def prompt(self, messages: Messages, prefill_ids: Sequence[int], prefill_text: str) -> List[int]:
        """The teacher's prompt tokens for a problem (its own template, then the assistant prefill)."""
        ids = prompt_tokens(self.tokenizer, self.messages(messages))
        if self.same_vocab:
            return ids + list(prefill_ids)
        return ids + plain_tokens(self.tokenizer, prefill_text)

    # -- scoring the student's tokens ---------------------------------------------------------------
    def score(self, teacher_prompt: Sequence[int], completion: Sequence[int], where: str = "sample") -> Scored:
        """The teacher's logprob of each student completion token, given the teacher's prompt."""
        teacher_prompt, completion = list(teacher_prompt), list(completion)
        if not completion:
            return Scored(_Done([]), lambda lps: [])
        self.calls += 1
        if self.same_vocab:
            n = len(teacher_prompt)
            return Scored(self.sampler.compute_logprobs(teacher_prompt + completion), lambda lps: [float(x) for x in lps[n:]])
        content, ends_turn = (completion[:-1], True) if completion[-1] in self.student_specials else (completion, False)
        text = _decode(self.student_tokenizer, content)
        teacher_ids = self.encode_exact(text, where)
        if ends_turn:
            if self.end_id is None:
                raise ConfigError(f"{self.name}: {where}: the teacher's chat template has no end-of-turn token to score the student's")
            teacher_ids = teacher_ids + [self.end_id]
        n = len(teacher_prompt)
        s_ends = char_ends(self.student_tokenizer, content, text)
        t_ends = char_ends(self.tokenizer, teacher_ids[: len(teacher_ids) - ends_turn], text)

        def finish(lps: List[Optional[float]]) -> List[float]:
            values = [float(x) for x in lps[n:]]
            mapped = spread_by_characters(s_ends, t_ends, values[: len(t_ends)]) if content else []
            return mapped + ([values[-1]] if ends_turn else [])

        return Scored(self.sampler.compute_logprobs(teacher_prompt + teacher_ids), finish)

    def encode_exact(self, text: str, where: str) -> List[int]:
        ids = plain_tokens(self.tokenizer, text)  # the student's text stays text for the teacher
        if _decode(self.tokenizer, ids) != text:
            raise ConfigError(
                f"{self.name}: {where}: the teacher's tokenizer cannot reproduce the student's text {text[:40]!r} exactly, "
                "so it cannot score the student's tokens; use a teacher whose tokenizer covers the student's text"
            )
        return ids

    # -- the teacher's samples as student tokens (off-policy) --------------------------------------
    def to_student(self, completion: Sequence[int], where: str = "sample") -> List[int]:
        """A teacher completion as student token ids (unchanged when the vocabularies agree)."""
        completion = list(completion)
        if self.same_vocab or not completion:
            return completion
        content, ends_turn = (completion[:-1], True) if completion[-1] in self.teacher_specials else (completion, False)
        text = _decode(self.tokenizer, content)
        ids = plain_tokens(self.student_tokenizer, text)
        if _decode(self.student_tokenizer, ids) != text:
            raise ConfigError(f"{self.name}: {where}: the student's tokenizer cannot reproduce the teacher's text {text[:40]!r} exactly")
        return ids + ([self.student_end_id] if ends_turn and self.student_end_id is not None else [])


class _Done:
    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


def task_prompt_parts(task: Any, problem: Any, tokenizer: Any) -> Tuple[List[int], Optional[Messages], List[int], str]:
    """``(student prompt, messages, prefill ids, prefill text)`` of a single-turn task's problem.

    The student prompt is the task's own (``task.prompt(problem, tokenizer)``); the prefill is what
    the task appends after the assistant header (e.g. ``"17 + 25 ="``), recovered by comparing with
    the messages' plain rendering. ``messages`` is ``None`` for a task that has none."""
    prompt = task.prompt(problem, tokenizer)
    if prompt is None:
        raise ConfigError(f"task {task.name!r}: distillation needs a task with a prompt (Task.prompt returned None)")
    prompt = list(prompt)
    messages = task.messages(problem)
    if messages is None:
        return prompt, None, [], ""
    base = prompt_tokens(tokenizer, messages)
    if prompt[: len(base)] != base:
        raise ConfigError(f"task {task.name!r}: its prompt is not the chat rendering of its messages, so a teacher cannot re-render it")
    prefill_ids = prompt[len(base):]
    return prompt, messages, prefill_ids, _decode(tokenizer, prefill_ids) if prefill_ids else ""
