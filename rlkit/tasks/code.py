"""Competitive programming with execution feedback: a multi-turn environment over MBPP or CodeContests.

**Problems** (``dataset``): ``mbpp`` (Austin et al. 2021, arXiv:2108.07732; assert tests) or
``codecontests`` (Li et al. 2022, arXiv:2203.07814; stdin/stdout tests). Each split is a source
``{path, hf_id, hf_config, split, start, limit, ids}`` (``ids``: keep only these problem ids,
e.g. ``mbpp/601``, in that order), or such sources keyed by dataset (``train: {mbpp: {ids: [...]}}``:
only the chosen dataset's applies, :func:`source_for`): the Hugging Face id is tried first when set,
and on failure (offline, unknown id) the local file under ``shared/data`` is used with a logged
note, so the default recipes run with no network. Defaults: MBPP ``train`` (task_ids 601-974)
and ``test`` (11-510) from ``mbpp/mbpp.jsonl``; CodeContests from
``codecontests/code_contests_test.json`` (165 problems): rows 0-64 are the held-out split, rows
65-164 the training split.

**Public vs hidden tests.** The hidden tests (the final reward) are *all* of a problem's tests,
as in the benchmarks' own grading. The public tests (shown in the prompt and run after each
non-final turn) are the first ``num_public_tests`` of them: for MBPP the first assert (it also
names the function to write); for the local CodeContests file, which has no public/private split,
the first test — in all 165 problems the first test's input appears verbatim in the statement,
i.e. it is the statement's example. Rows loaded from the Hub carry their real public-test count,
which is used instead.

**Turns** (``turns``, default 2; set ``train.rollout.max_turns`` to the same value):

1. prompt = the problem, its public tests, an instruction to answer with one ```python block,
   and (``prefill``) the assistant turn opened with ```` ```python ```` so the model writes code at
   once (pair it with ``train.stop: ["```"]`` to end the turn at the closing fence);
2. the env extracts the program (last fenced block), runs the public tests in the sandbox and
   appends, as tokens, the end of the assistant turn, a user turn with the failures (verdict,
   input, expected and actual output, error; or "All public tests passed") and the assistant
   header (+ prefill) — rendered through the tokenizer's chat template; the model's tokens are
   never re-encoded;
3. the last turn's program (or, with ``keep_last_program``, the previous one when the last turn
   has no code) is graded on the hidden tests: reward = all passed (0/1, ``reward: all_passed``)
   or the pass fraction (``reward: pass_fraction``). Earlier turns get reward 0. With
   ``stop_on_pass`` an attempt that passes every public test ends the episode at once (graded
   on the hidden tests like a last turn), so only failing programs get a second turn.

Metrics on the final transition: ``pass_fraction``, ``all_passed``, ``has_code``,
``timeout_fraction``, ``sandbox_error_fraction``, ``public_pass_fraction``, ``turns``; with
``grade_every_turn`` the hidden tests also grade each earlier turn (``turn1_all_passed``,
``turn1_pass_fraction``, ...; every non-final turn played) so the value of the feedback turn is
visible. ``has_code`` means a program was graded (with ``keep_last_program`` it may come from an
earlier turn). ``info`` holds the
extracted program's verdict, per-test verdicts and the feedback text of every turn.

Sandbox limits per program: ``cpu_time_s`` (per test), ``wall_time_s``, ``memory_mb``; the
problems' own time/memory limits (CodeContests) are not used, since they were set for C++.
All programs of all envs go through one bounded :class:`~rlkit.sandbox.SandboxPool`
(``sandbox_workers``) owned by the task.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence

from rlkit.chat import plain_tokens, prompt_tokens
from rlkit.data import resolve_path
from rlkit.errors import ConfigError, DataError
from rlkit.rewards.code import CodeExecutionReward, TestReport, extract_program
from rlkit.rewards.code_data import MBPP_SPLITS, load_codecontests, load_mbpp
from rlkit.tasks.base import Env, EnvGroup, StepResult, Task, Trajectory, few_shot_messages, split_problems
from rlkit.sandbox import SandboxLimits, SandboxPool

log = logging.getLogger("rlkit.tasks.code")

MiB = 1 << 20
SOURCES: Dict[str, Dict[str, Dict[str, Any]]] = {
    "mbpp": {
        "train": {"path": "mbpp/mbpp.jsonl", "hf_id": None, "hf_config": "full", "split": "train"},
        "test": {"path": "mbpp/mbpp.jsonl", "hf_id": None, "hf_config": "full", "split": "test"},
        "shots": {"path": "mbpp/mbpp.jsonl", "hf_id": None, "hf_config": "full", "split": "prompt"},
    },
    "codecontests": {
        "train": {"path": "codecontests/code_contests_test.json", "hf_id": None, "split": "train", "start": 65},
        "test": {"path": "codecontests/code_contests_test.json", "hf_id": None, "split": "test", "limit": 65},
    },
}
MBPP_INSTRUCTION = "Write a Python function for this task. Answer with one ```python code block."
CC_INSTRUCTION = ("Solve this competitive programming problem in Python 3. The program reads standard "
                  "input and writes standard output. Answer with one ```python code block.")
FIX = "Reply with the complete corrected program in one ```python code block."
SENTINEL = "\u2063RLKIT_ASSISTANT_TURN\u2063"


def _clip(text: str, limit: int) -> str:
    text = text.rstrip("\n")
    return text if len(text) <= limit else text[:limit] + f" ... [{len(text) - limit} more characters]"


SOURCE_KEYS = frozenset({"path", "hf_id", "hf_config", "split", "start", "limit", "ids"})


def source_for(dataset: str, split: str, spec: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The source keys of ``task.<split>`` that apply to ``dataset``.

    A recipe may key its sources by dataset (``train: {mbpp: {ids: [...]}, codecontests: {hf_id:
    ...}}``): only the chosen dataset's block applies, so ``train.task.dataset=...`` alone switches
    a recipe whose sources belong to one dataset. Plain keys (``train: {ids: [...]}``) apply to
    whichever dataset runs. Every block is checked, so a typo fails whichever dataset is chosen;
    mixing the two forms is one line."""
    given = dict(spec or {})
    blocks = {k: v for k, v in given.items() if k in SOURCES}
    plain = {k: v for k, v in given.items() if k not in SOURCES}
    if blocks and plain:
        raise ConfigError(f"task.{split}: either source keys {sorted(SOURCE_KEYS)} or blocks keyed by dataset "
                          f"{sorted(SOURCES)}, not both (got {sorted(given)})")
    for where, keys in ([(f"task.{split}.{k}", dict(v or {})) for k, v in blocks.items()] if blocks else [(f"task.{split}", plain)]):
        unknown = set(keys) - SOURCE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)} (a source takes {sorted(SOURCE_KEYS)})")
    return dict(blocks.get(dataset) or {}) if blocks else plain


class CodeTask(Task):
    """MBPP or CodeContests problems as a multi-turn coding environment (see the module docstring)."""

    name = "code"

    def __init__(
        self,
        dataset: str = "mbpp",
        train: Optional[Mapping[str, Any]] = None,
        test: Optional[Mapping[str, Any]] = None,
        num_train: Optional[int] = None,
        num_test: Optional[int] = None,
        hf_tests: Sequence[str] = ("public", "private"),
        num_public_tests: int = 1,
        max_hidden_tests: Optional[int] = None,
        max_statement_chars: Optional[int] = None,
        num_shots: int = 0,
        system_prompt: Optional[str] = None,
        prefill: str = "```python\n",
        turns: int = 2,
        reward: str = "all_passed",
        keep_last_program: bool = True,
        stop_on_pass: bool = False,
        grade_every_turn: bool = True,
        max_feedback_tests: int = 3,
        max_feedback_chars: int = 300,
        sandbox_workers: int = 2,
        cpu_time_s: float = 2.0,
        wall_time_s: float = 6.0,
        memory_mb: int = 512,
        float_tolerance: Optional[float] = None,
    ):
        if dataset not in SOURCES:
            raise ConfigError(f"task.dataset={dataset!r}: choose from {sorted(SOURCES)}")
        if reward not in ("all_passed", "pass_fraction"):
            raise ConfigError(f"task.reward={reward!r}: choose all_passed (0/1) or pass_fraction")
        if turns < 1 or num_public_tests < 0:
            raise ConfigError("task.turns must be >= 1 and task.num_public_tests >= 0")
        if num_shots and dataset != "mbpp":
            raise ConfigError("task.num_shots: solved examples exist only for mbpp (its 'prompt' split)")
        self.dataset, self.turns, self.reward_mode = dataset, int(turns), reward
        self.num_public_tests, self.max_hidden_tests = int(num_public_tests), max_hidden_tests
        self.system_prompt, self.prefill = system_prompt, prefill or ""
        self.keep_last_program, self.stop_on_pass, self.grade_every_turn = keep_last_program, stop_on_pass, grade_every_turn
        self.max_feedback_tests, self.max_feedback_chars = max_feedback_tests, max_feedback_chars
        self._hf_tests = tuple(hf_tests)
        self._splits: Dict[str, List[Dict[str, Any]]] = {}
        for split, spec, limit in (("train", train, num_train), ("test", test, num_test)):
            problems = self._load(split, spec)
            if max_statement_chars:
                problems = [p for p in problems if len(p["statement"]) <= max_statement_chars]
            self._splits[split] = problems[:limit] if limit is not None else problems
        self._shots = self._load("shots", None)[:num_shots] if num_shots else []
        self.limits = SandboxLimits(cpu_time_s=cpu_time_s, wall_time_s=wall_time_s, memory_bytes=int(memory_mb) * MiB)
        self._workers, self._pool = int(sandbox_workers), None
        self._grader: Optional[CodeExecutionReward] = None
        self.float_tolerance = float_tolerance

    # -- data ---------------------------------------------------------------------------------------
    def _load(self, split: str, spec: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
        given = source_for(self.dataset, split, spec)
        spec = {**SOURCES[self.dataset][split], **given}
        rows, from_file = None, False
        if spec.get("hf_id"):
            try:
                import datasets

                dataset = datasets.load_dataset(spec["hf_id"], spec.get("hf_config"), split=spec.get("split") or split)
                if self.dataset == "codecontests" and hasattr(dataset, "select_columns"):  # skip unused test sets
                    wanted = ["name", "description", "time_limit", "memory_limit_bytes"] + [f"{t}_tests" for t in self._hf_tests]
                    dataset = dataset.select_columns([c for c in wanted if c in dataset.column_names])
                rows = list(dataset)
            except Exception as exc:  # noqa: BLE001 - offline, unknown id...: fall back to the file
                if not spec.get("path"):
                    raise DataError(f"code task {split}: cannot load {spec['hf_id']!r} ({exc}); set a local path") from None
                log.warning("note: code task %s: Hugging Face dataset %r unavailable (%s); using %s",
                            split, spec["hf_id"], str(exc).splitlines()[0] if str(exc) else type(exc).__name__, spec["path"])
        if rows is None:
            if not spec.get("path"):
                raise DataError(f"code task {split}: no data source (set task.{split}.path or hf_id)")
            rows, from_file = str(resolve_path(spec["path"])), True
        if self.dataset == "mbpp":
            records = load_mbpp(rows)
            if from_file and spec.get("split") in MBPP_SPLITS:  # the local file holds every split
                lo, hi = MBPP_SPLITS[spec["split"]]
                records = [r for r in records if lo <= int(r["task_id"]) <= hi]
        else:
            records = load_codecontests(rows, include=self._hf_tests)
        window = spec if from_file else given  # the default start/limit describe the local files
        start, limit = int(window.get("start") or 0), window.get("limit")
        records = records[start: start + int(limit) if limit is not None else None]
        out = [self._problem(r) for r in records]
        dropped = sum(p is None for p in out)
        if dropped:
            log.warning("code task %s: %d problems without tests dropped", split, dropped)
        out = [p for p in out if p is not None]
        if spec.get("ids") is not None:  # an explicit subset, in the order given
            by_id = {p["id"]: p for p in out}
            missing = [i for i in spec["ids"] if i not in by_id]
            if missing:
                raise DataError(f"code task {split}: ids not found: {missing[:5]}")
            out = [by_id[i] for i in spec["ids"]]
        if not out:
            raise DataError(f"code task {split}: no problems in {spec}")
        return out

    def _problem(self, r: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """A uniform record: ``statement``, ``kind`` (asserts | stdio), tests, ``num_public``."""
        if self.dataset == "mbpp":
            tests = list(r["test_list"])[: self.max_hidden_tests]
            if not tests:
                return None
            return {"id": f"mbpp/{r['task_id']}", "kind": "asserts", "statement": r["prompt"], "test_list": tests,
                    "test_setup_code": r.get("test_setup_code") or "", "reference": r.get("code") or "",
                    "num_public": min(self.num_public_tests, len(tests))}
        inputs, outputs = list(r["tests"]["inputs"]), list(r["tests"]["outputs"])
        if self.max_hidden_tests is not None:
            inputs, outputs = inputs[: self.max_hidden_tests], outputs[: self.max_hidden_tests]
        if not inputs:
            return None
        public = r.get("num_public_tests")
        public = self.num_public_tests if public is None else int(public)
        name = r.get("name") or hashlib.sha1(r["problem"].encode()).hexdigest()[:10]
        return {"id": f"codecontests/{name}", "kind": "stdio",
                "statement": r["problem"], "tests": {"inputs": inputs, "outputs": outputs},
                "num_public": min(public, len(inputs))}

    def problems(self, split: str) -> List[Dict[str, Any]]:
        return split_problems("code", self._splits, split)

    # -- prompts ------------------------------------------------------------------------------------
    def user_message(self, problem: Mapping[str, Any]) -> str:
        k = problem["num_public"]
        if problem["kind"] == "asserts":
            text = f"{MBPP_INSTRUCTION}\n\n{problem['statement']}"
            if k:
                tests = "\n".join(problem["test_list"][:k])
                text += f"\n\nYour code should pass {'this test' if k == 1 else 'these tests'}:\n```python\n{tests}\n```"
            return text
        return f"{CC_INSTRUCTION}\n\n{problem['statement'].strip()}"

    def messages(self, problem: Mapping[str, Any]) -> List[Dict[str, str]]:
        return few_shot_messages(problem, self._shots, self.user_message, lambda s: f"```python\n{s['reference'].strip()}\n```",
                                 system=self.system_prompt)

    def prompt(self, problem: Mapping[str, Any], tokenizer: Any) -> List[int]:
        return prompt_tokens(tokenizer, self.messages(problem), prefill=self.prefill)

    def env_group(self, problem: Mapping[str, Any], tokenizer: Any) -> "CodeEnvGroup":
        return CodeEnvGroup(self, problem, self.messages(problem), self.prompt(problem, tokenizer), tokenizer)

    @property
    def has_references(self) -> bool:
        """Whether problems carry a reference program (MBPP's ``code``; the CodeContests file has none)."""
        return self.dataset == "mbpp"

    def reference_completion(self, problem: Mapping[str, Any]) -> str:
        """The reference program as the assistant would write it after the prompt (for the SFT
        baseline): ```` ```python\n<code>\n``` ```` minus the ``prefill`` the prompt already ends with."""
        code = str(problem.get("reference") or "").strip()
        if not code:
            raise DataError(f"code task: problem {problem.get('id')} has no reference program (only MBPP rows do)")
        full = f"```python\n{code}\n```"
        if not full.startswith(self.prefill):
            raise ConfigError(f"task.prefill={self.prefill!r} does not begin a ```python block; the reference cannot follow it")
        return full[len(self.prefill):]

    # -- grading ------------------------------------------------------------------------------------
    @property
    def grader(self) -> CodeExecutionReward:
        """One grader over one bounded sandbox pool, shared by every env of this task."""
        if self._grader is None:
            self._pool = SandboxPool(self._workers, limits=self.limits)
            self._grader = CodeExecutionReward(limits=self.limits, pool=self._pool, float_tolerance=self.float_tolerance)
        return self._grader

    def grade(self, source: str, problem: Mapping[str, Any], num_tests: Optional[int] = None) -> TestReport:
        """Run the first ``num_tests`` tests (default all: the hidden tests) on ``source``."""
        if problem["kind"] == "asserts":
            sub = {"test_list": problem["test_list"][:num_tests], "test_setup_code": problem["test_setup_code"]}
        else:
            tests = problem["tests"]
            sub = {"tests": {"inputs": tests["inputs"][:num_tests], "outputs": tests["outputs"][:num_tests]}}
        return self.grader.grade(source, sub)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool, self._grader = None, None

    def feedback(self, problem: Mapping[str, Any], extract_verdict: str, report: Optional[TestReport]) -> str:
        """The user turn after a non-final attempt."""
        if report is None:
            why = {"no_python_block": "a code block in another language"}.get(extract_verdict, "no ```python code block")
            return f"I could not run your answer: it has {why}. {FIX}"
        if report.all_passed or not report.cases:
            done = "All public tests passed." if report.cases else "This problem has no public tests."
            return (f"{done} Hidden tests will also be run: if you see a bug or a missed edge case, reply with the "
                    "corrected program; otherwise repeat your program. Use one ```python code block.")
        failed = [c for c in report.cases if not c.passed]
        lines = [f"Your program failed {len(failed)} of {report.n_tests} public tests."]
        if report.program_error:
            lines.append(f"The program itself failed before any test: {_clip(report.program_error, self.max_feedback_chars)}")
        n = self.max_feedback_chars
        for c in failed[: self.max_feedback_tests]:
            verdict = c.verdict.replace("_", " ")
            if problem["kind"] == "asserts":
                lines.append(f"\nTest: {problem['test_list'][c.index]}\nResult: {verdict}" + (f" ({_clip(c.error, n)})" if c.error else ""))
            else:
                lines.append(f"\nTest {c.index + 1}: {verdict}\nInput:\n{_clip(problem['tests']['inputs'][c.index], n)}\n"
                             f"Expected output:\n{_clip(problem['tests']['outputs'][c.index], n)}\n"
                             f"Your output:\n{_clip(c.output, n) or '(nothing)'}" + (f"\nError: {_clip(c.error, n)}" if c.error else ""))
        lines.append("\n" + FIX)
        return "\n".join(lines)


class CodeEnv(Env):
    """One attempt sequence at one problem (single use); see the module docstring."""

    def __init__(self, task: CodeTask, problem: Mapping[str, Any], messages: List[Dict[str, str]], prompt: List[int], tokenizer: Any):
        self.task, self.problem, self.tokenizer = task, problem, tokenizer
        self.messages = list(messages)  # the conversation so far, assistant turns as placeholders
        self.prompt = list(prompt)
        self.turn = 0
        self.program: Optional[str] = None
        self.turn_metrics: Dict[str, float] = {}

    def initial_observation(self) -> List[int]:
        return list(self.prompt)

    def step(self, action: List[int]) -> StepResult:
        task, problem = self.task, self.problem
        self.turn += 1
        text = task.prefill + self.tokenizer.decode(action, skip_special_tokens=True)
        extracted = extract_program(text)
        has_code = extracted.source is not None
        if has_code:
            self.program = extracted.source
        k = problem["num_public"]
        info: Dict[str, Any] = {"turn": self.turn, "extract": extracted.verdict}
        hidden = public = None
        last = self.turn >= task.turns
        if not last and has_code:
            if task.grade_every_turn or task.stop_on_pass:  # one run gives both (public = first k hidden)
                hidden = task.grade(extracted.source, problem)
                public = TestReport(cases=hidden.cases[:k], program_error=hidden.program_error)
            else:
                public = task.grade(extracted.source, problem, k)
            last = task.stop_on_pass and public.all_passed
        if self.turn < task.turns:  # per-turn metrics of every non-final turn played
            prefix = f"turn{self.turn}_"
            self.turn_metrics.update({prefix + "has_code": float(has_code),
                                      prefix + "public_pass_fraction": public.pass_fraction if public else 0.0})
            if task.grade_every_turn:
                self.turn_metrics.update({prefix + "pass_fraction": hidden.pass_fraction if hidden else 0.0,
                                          prefix + "all_passed": float(hidden.all_passed) if hidden else 0.0})
        if not last:
            message = task.feedback(problem, extracted.verdict, public)
            info.update({"public": public.to_dict() if public else None, "feedback": message})
            if hidden is not None:
                info["hidden"] = hidden.to_dict()
            return StepResult(reward=0.0, done=False, next_observation=self._next_observation(action, message),
                              metrics=dict(self.turn_metrics), info=info)

        source = extracted.source if has_code or not task.keep_last_program else self.program
        if source is None:
            report = TestReport()
            info["hidden"] = None
        else:
            if hidden is None:
                hidden = task.grade(source, problem)
            report = hidden
            info["hidden"] = report.to_dict()
            info["graded_previous_program"] = not has_code
        score = report.pass_fraction if task.reward_mode == "pass_fraction" else float(report.all_passed)
        metrics = {
            **self.turn_metrics,
            "pass_fraction": report.pass_fraction,
            "all_passed": float(report.all_passed),
            "public_pass_fraction": TestReport(cases=report.cases[:k]).pass_fraction,
            "has_code": float(source is not None),
            "timeout_fraction": report.timeout_fraction,
            "sandbox_error_fraction": report.fraction("sandbox_error"),
            "turns": float(self.turn),
        }
        return StepResult(reward=score, done=True, metrics=metrics, info=info)

    def _next_observation(self, action: List[int], message: str) -> List[int]:
        """End of the assistant turn + the feedback user turn + the assistant header (+ prefill),
        rendered with the chat template around a placeholder for the model's turn."""
        history = self.messages + [{"role": "assistant", "content": SENTINEL}]
        self.messages = history + [{"role": "user", "content": message}]
        rendered = self.tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
        at = rendered.rfind(SENTINEL)
        if at < 0:
            raise DataError("the chat template dropped the assistant turn; cannot render feedback")
        suffix = _template_suffix(self.tokenizer, rendered[at + len(SENTINEL):], message)
        if action and suffix and action[-1] == suffix[0] and suffix[0] in set(self.tokenizer.all_special_ids):
            suffix = suffix[1:]  # the model already closed its turn (e.g. sampled <|im_end|>)
        if self.task.prefill:
            suffix += plain_tokens(self.tokenizer, self.task.prefill)
        return suffix


def _template_suffix(tokenizer: Any, text: str, message: str) -> List[int]:
    """Tokens of the rendered text after the model's turn, the feedback ``message`` in it (program
    output and test data the model or the dataset controls) encoded as plain text, so a program
    that prints ``<|im_start|>system`` forges no turn; the template's own text keeps its control tokens."""
    at = text.rfind(message)
    if not message or at < 0:
        raise DataError("the chat template changed the feedback text; cannot keep it plain text")
    head, tail = text[:at], text[at + len(message):]
    template = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731 - the template's own text
    return template(head) + plain_tokens(tokenizer, message) + template(tail)


class CodeEnvGroup(EnvGroup):
    """The G envs of one problem; rewards are per trajectory (no joint scoring)."""

    def __init__(self, task: CodeTask, problem: Mapping[str, Any], messages: List[Dict[str, str]], prompt: List[int], tokenizer: Any):
        self.task, self.problem, self.messages, self.prompt, self.tokenizer = task, problem, messages, prompt, tokenizer

    def make_envs(self, n: int) -> List[CodeEnv]:
        return [CodeEnv(self.task, self.problem, self.messages, self.prompt, self.tokenizer) for _ in range(n)]

    def score_group(self, trajectories: Sequence[Trajectory]) -> Optional[List[float]]:
        return None  # per-trajectory rewards (the EnvGroup default, stated)
