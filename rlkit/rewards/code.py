"""Code-execution reward: extract the program from a completion, run its tests in the sandbox.

Two test styles, read from the problem record:

* stdin/stdout (CodeContests): ``problem["tests"] = {"inputs": [...], "outputs": [...]}``; one
  sandboxed process per test, stdout compared with the expected output token by token
  (whitespace-insensitive: ``a.split() == b.split()``), see :func:`run_stdio_tests`.
* asserts (MBPP): ``problem["test_list"]`` (+ ``test_setup_code`` or ``test_imports``); one
  process runs the program then each assert under its own timer and reports a verdict per
  test, see :func:`run_assert_tests`.

Every program runs in :mod:`rlkit.sandbox` (no network, private uid, rlimits, time limits).
Dataset loaders live in :mod:`rlkit.rewards.code_data`.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from rlkit.errors import DataError
from rlkit.rewards.base import RewardResult
from rlkit.sandbox import ExecutionResult, SandboxLimits, SandboxPool, run_program

PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[ \t]*([^\s`]*)[^`]*$")
EXCERPT = 200


@dataclass(frozen=True)
class ExtractedProgram:
    """``source`` is None unless a program was found; ``verdict`` says how it was found:
    ``ok``, ``unterminated_block`` (last fence never closed: the rest of the text is taken),
    ``no_code_block``, ``no_python_block`` (only other languages), ``empty_code_block``."""

    source: Optional[str]
    verdict: str
    n_blocks: int = 0
    language: Optional[str] = None


def extract_program(completion: str) -> ExtractedProgram:
    """The LAST fenced code block tagged python/py/python3 or untagged (```` ``` ```` or ``~~~``)."""
    blocks: list[tuple[str, list[str], bool]] = []  # (tag, lines, closed)
    current: Optional[tuple[str, str, list[str]]] = None  # (fence, tag, lines)
    for line in completion.splitlines():
        m = _FENCE.match(line)
        if current is None:
            if m:
                current = (m.group(1), m.group(2).lower(), [])
            continue
        fence, tag, lines = current
        if m and not m.group(2) and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and line.strip() == m.group(1):
            blocks.append((tag, lines, True))
            current = None
        else:
            lines.append(line)
    if current is not None:
        blocks.append((current[1], current[2], False))
    if not blocks:
        return ExtractedProgram(None, "no_code_block")
    python_blocks = [b for b in blocks if b[0] in PYTHON_TAGS]
    if not python_blocks:
        return ExtractedProgram(None, "no_python_block", len(blocks), blocks[-1][0])
    tag, lines, closed = python_blocks[-1]
    source = "\n".join(lines).strip("\n")
    if not source.strip():
        return ExtractedProgram(None, "empty_code_block", len(blocks), tag or None)
    return ExtractedProgram(source + "\n", "ok" if closed else "unterminated_block",
                            len(blocks), tag or None)


@dataclass
class TestCaseResult:
    """One test. ``verdict``: ``passed``, ``wrong_answer``, ``not_run`` or a sandbox verdict
    (``runtime_error``, ``timeout``, ``memory_limit``, ``output_limit``, ``killed``,
    ``sandbox_error``)."""

    index: int
    verdict: str
    time_s: Optional[float] = None
    error: Optional[str] = None
    output: str = ""  # excerpt of what the program printed
    expected: str = ""  # excerpt of the expected output, or the assert's source

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


@dataclass
class TestReport:
    cases: list[TestCaseResult] = field(default_factory=list)
    program_error: Optional[str] = None  # the program failed before any test (asserts style)

    @property
    def n_tests(self) -> int:
        return len(self.cases)

    @property
    def n_passed(self) -> int:
        return sum(c.passed for c in self.cases)

    @property
    def pass_fraction(self) -> float:
        return self.n_passed / self.n_tests if self.cases else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.cases) and self.n_passed == self.n_tests

    def fraction(self, verdict: str) -> float:
        return sum(c.verdict == verdict for c in self.cases) / self.n_tests if self.cases else 0.0

    @property
    def timeout_fraction(self) -> float:
        return self.fraction("timeout")

    def to_dict(self) -> dict[str, Any]:
        return {"pass_fraction": self.pass_fraction, "all_passed": self.all_passed,
                "program_error": self.program_error,
                "tests": [asdict(c) for c in self.cases]}


def _excerpt(text: str, limit: int = EXCERPT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def outputs_match(got: str, expected: str, float_tolerance: Optional[float] = None) -> bool:
    """Token-wise comparison; with ``float_tolerance``, numeric tokens may differ by that much
    (absolute or relative)."""
    a, b = got.split(), expected.split()
    if a == b:
        return True
    if float_tolerance is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if abs(fx - fy) > float_tolerance * max(1.0, abs(fy)):
            return False
    return True


def _submit(pool: Optional[SandboxPool], source: str, stdin: str, limits: SandboxLimits,
            files: Optional[Mapping[str, str]] = None):
    if pool is not None:
        return pool.submit(source, stdin, limits=limits, files=files)
    return run_program(source, stdin, limits=limits, files=files)


def run_stdio_tests(source: str, inputs: Sequence[str], outputs: Sequence[str], *,
                    limits: Optional[SandboxLimits] = None, pool: Optional[SandboxPool] = None,
                    float_tolerance: Optional[float] = None) -> TestReport:
    """CodeContests style: run ``source`` once per input (in parallel on ``pool`` if given)."""
    if len(inputs) != len(outputs):
        raise DataError(f"stdio tests: {len(inputs)} inputs but {len(outputs)} outputs")
    limits = limits or SandboxLimits()
    pending = [_submit(pool, source, stdin, limits) for stdin in inputs]
    report = TestReport()
    for i, (job, expected) in enumerate(zip(pending, outputs)):
        res: ExecutionResult = job.result() if pool is not None else job
        if res.verdict == "ok":
            verdict = "passed" if outputs_match(res.stdout, expected, float_tolerance) else "wrong_answer"
        else:
            verdict = res.verdict
        error = res.error or (_excerpt(res.stderr.strip()[-EXCERPT:]) if verdict != "passed" and
                              res.stderr.strip() else None)
        report.cases.append(TestCaseResult(i, verdict, res.wall_time_s, error,
                                           _excerpt(res.stdout), _excerpt(expected)))
    return report


HARNESS = r'''
import json as _json, os as _os, signal as _signal, sys as _sys, time as _time
def _rlkit_harness(nonce, tests, setup, per_test):
    try:
        _os.unlink(__file__)
    except OSError:
        pass
    fd, write, perf = _os.dup(1), _os.write, _time.perf_counter
    def emit(rec):
        try:
            _sys.stdout.flush()
        except BaseException:
            pass
        write(fd, ("\n" + nonce + _json.dumps(rec) + "\n").encode())
    class Timeout(BaseException):
        pass
    def on_alarm(*_):
        raise Timeout()
    def run(code, name, g):
        _signal.signal(_signal.SIGALRM, on_alarm)
        _signal.signal(_signal.SIGPROF, on_alarm)
        _signal.setitimer(_signal.ITIMER_PROF, per_test)
        _signal.setitimer(_signal.ITIMER_REAL, 3 * per_test + 1)
        t0 = perf()
        try:
            exec(compile(code, name, "exec"), g)
            verdict, err = "passed", None
        except Timeout:
            verdict, err = "timeout", "test exceeded %%.3g s" %% per_test
        except AssertionError as e:
            verdict, err = "wrong_answer", ("AssertionError: %%s" %% e) if str(e) else "AssertionError"
        except MemoryError:
            verdict, err = "memory_limit", "MemoryError"
        except BaseException as e:
            verdict, err = "runtime_error", ("%%s: %%s" %% (type(e).__name__, e))[:300]
        finally:
            _signal.setitimer(_signal.ITIMER_PROF, 0)
            _signal.setitimer(_signal.ITIMER_REAL, 0)
        return verdict, err, perf() - t0
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    with open("solution.py", encoding="utf-8") as f:
        src = f.read()
    verdict, err, dt = run(src + "\n" + setup, "solution.py", g)
    if verdict != "passed":
        emit({"stage": "program", "verdict": verdict, "error": err, "time": dt})
        return
    for i, test in enumerate(tests):
        verdict, err, dt = run(test, "test_%%d" %% i, g)
        emit({"i": i, "verdict": verdict, "error": err, "time": dt})
    emit({"done": True})
_rlkit_harness(%(nonce)r, _json.loads(%(tests)r), %(setup)r, %(per_test)r)
'''


def _parse_records(stdout: str, nonce: str) -> tuple[list[dict], str]:
    records, visible = [], []
    for line in stdout.split("\n"):
        at = line.find(nonce)
        if at < 0:
            visible.append(line)
            continue
        visible.append(line[:at])
        try:
            records.append(json.loads(line[at + len(nonce):]))
        except ValueError:
            pass
    return records, "\n".join(visible).strip("\n")


def run_assert_tests(source: str, test_list: Sequence[str], setup_code: str = "", *,
                     limits: Optional[SandboxLimits] = None, pool: Optional[SandboxPool] = None,
                     per_test_timeout_s: Optional[float] = None) -> TestReport:
    """MBPP style: one sandboxed process runs ``source`` + ``setup_code``, then each assert
    with its own timers: ``per_test_timeout_s`` of CPU time (default ``limits.cpu_time_s``)
    and ``3 * per_test_timeout_s + 1`` seconds of wall time.

    Results come back as lines tagged with a random nonce (the harness deletes its own file
    before running the program), so an early ``exit(0)`` in the program cannot fake a pass:
    a test without a record counts as failed. If the process dies during test ``k``, test
    ``k`` gets the process verdict and later tests ``not_run``.
    """
    limits = limits or SandboxLimits()
    per_test = float(per_test_timeout_s or limits.cpu_time_s)
    slots = len(test_list) + 1
    proc_limits = replace(limits, cpu_time_s=per_test * slots + 1,
                          wall_time_s=limits.wall_time_s + (3 * per_test + 1) * slots)
    nonce = secrets.token_hex(16)
    harness = HARNESS % {"nonce": nonce, "tests": json.dumps(list(test_list)),
                         "setup": setup_code or "", "per_test": per_test}
    job = _submit(pool, harness, "", proc_limits, {"solution.py": source})
    res: ExecutionResult = job.result() if pool is not None else job
    records, visible = _parse_records(res.stdout, nonce)
    by_index = {r["i"]: r for r in records if "i" in r}
    program = next((r for r in records if r.get("stage") == "program"), None)
    report = TestReport(program_error=program and (program.get("error") or program["verdict"]))
    if program is not None and program["verdict"] not in ("timeout", "memory_limit"):
        program["verdict"] = "runtime_error"  # e.g. an assert at the program's top level
    dead = False
    for i, test in enumerate(test_list):
        rec = by_index.get(i)
        if rec is not None:
            case = TestCaseResult(i, rec["verdict"], rec.get("time"), rec.get("error"))
        elif program is not None:
            case = TestCaseResult(i, program["verdict"], None, report.program_error)
        elif dead:
            case = TestCaseResult(i, "not_run")
        else:
            dead = True
            verdict = res.verdict if res.verdict != "ok" else "runtime_error"
            why = res.error or _excerpt(res.stderr.strip()[-EXCERPT:]) or \
                "the program ended before this test reported"
            case = TestCaseResult(i, verdict, None, why)
        case.output, case.expected = _excerpt(visible), _excerpt(test)
        report.cases.append(case)
    return report


class CodeExecutionReward:
    """``(completion, problem) -> RewardResult``: 1.0 when every test passes, else 0.0
    (``partial_credit=True``: the pass fraction). Tests come from ``problem["tests"]``
    (stdin/stdout) or ``problem["test_list"]`` (asserts, with ``test_setup_code`` or
    ``test_imports``). Metrics: ``pass_fraction``, ``all_passed``, ``has_code``,
    ``timeout_fraction``, ``sandbox_error_fraction``; ``info`` holds per-test details.

    Without ``pool`` a private :class:`SandboxPool` of ``max_workers`` (default 2) is created on
    first use; :meth:`close` shuts it down.
    """

    name = "code"

    def __init__(self, *, partial_credit: bool = False, limits: Optional[SandboxLimits] = None,
                 pool: Optional[SandboxPool] = None, max_workers: int = 2,
                 per_test_timeout_s: Optional[float] = None,
                 float_tolerance: Optional[float] = None):
        self.partial_credit = partial_credit
        self.limits = limits or SandboxLimits()
        self.per_test_timeout_s = per_test_timeout_s
        self.float_tolerance = float_tolerance
        self._pool, self._own_pool, self._max_workers = pool, pool is None, max_workers
        self._lock = threading.Lock()

    @property
    def pool(self) -> SandboxPool:
        with self._lock:
            if self._pool is None:
                self._pool = SandboxPool(self._max_workers, limits=self.limits)
            return self._pool

    def close(self) -> None:
        if self._own_pool and self._pool is not None:
            self._pool.close()
            self._pool = None

    def grade(self, source: str, problem: Mapping[str, Any]) -> TestReport:
        tests = problem.get("tests")
        if isinstance(tests, Mapping) and "inputs" in tests:
            return run_stdio_tests(source, tests["inputs"], tests.get("outputs", []),
                                   limits=self.limits, pool=self.pool,
                                   float_tolerance=self.float_tolerance)
        if problem.get("test_list") is not None:
            setup = problem.get("test_setup_code") or "\n".join(problem.get("test_imports") or [])
            return run_assert_tests(source, problem["test_list"], setup, limits=self.limits,
                                    pool=self.pool, per_test_timeout_s=self.per_test_timeout_s)
        raise DataError("code reward: the problem has neither 'tests' {inputs, outputs} "
                        "nor 'test_list'")

    def __call__(self, completion: str, problem: Mapping[str, Any]) -> RewardResult:
        extracted = extract_program(completion)
        if extracted.source is None:
            metrics = {"pass_fraction": 0.0, "all_passed": 0.0, "has_code": 0.0,
                       "timeout_fraction": 0.0, "sandbox_error_fraction": 0.0}
            return RewardResult(0.0, metrics, {"extract": extracted.verdict, "tests": []})
        report = self.grade(extracted.source, problem)
        reward = report.pass_fraction if self.partial_credit else float(report.all_passed)
        metrics = {"pass_fraction": report.pass_fraction, "all_passed": float(report.all_passed),
                   "has_code": 1.0, "timeout_fraction": report.timeout_fraction,
                   "sandbox_error_fraction": report.fraction("sandbox_error")}
        info = {"extract": extracted.verdict, **report.to_dict()}
        return RewardResult(reward, metrics, info)
