"""lm-eval's code benchmarks scored in rlkit's sandbox, never by executing model code in this process.

lm-eval's ``mbpp`` and ``humaneval`` (and their ``_plus`` / ``_instruct`` / ``_64`` variants) score
with Hugging Face ``evaluate``'s ``code_eval``: their ``utils.py`` runs ``hf_evaluate.load("code_eval")``
at import and calls its ``compute(references=, predictions=, k=)``, which executes every candidate
program plus its tests in a forked child of the evaluating process (no isolation beyond disabling
a list of ``os`` functions), and only with ``HF_ALLOW_CODE_EVAL=1``.

Here the task's own ``utils.py`` is executed with its ``evaluate`` import replaced by a stand-in
whose ``load("code_eval")`` returns :class:`SandboxCodeEval` (:func:`load_task_module`), so the
task's metric and filter functions — prompts, code extraction, the pass@k call — run unchanged,
while each program runs in :mod:`rlkit.sandbox` (new namespaces, no network, a private uid,
rlimits, a read-only host). Inside the sandbox a small runner reproduces ``code_eval``'s verdict:
the program ``candidate + "\\n" + test`` is ``exec``-ed in fresh globals with the same guard
(``exit``/``quit``, process, file-removal and ``os.chdir``-type functions set to ``None``), stdout
and stderr swallowed, stdin unreadable and a 3-second timer; it passes iff it finishes without
raising. pass@k is the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
Trained on Code", arXiv:2107.03374), the one ``code_eval`` reports.
"""

from __future__ import annotations

import ast
import json
import threading
import types
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: runs in the sandbox as main.py: exec program.py as code_eval's check_correctness does
RUNNER = r'''
import builtins, contextlib, io, json, os, shutil, signal, subprocess, sys
source = open("program.py", encoding="utf-8").read()
timeout = float(open("timeout.txt").read())

class _NoInput(io.StringIO):
    def read(self, *a, **k): raise IOError
    def readline(self, *a, **k): raise IOError
    def readlines(self, *a, **k): raise IOError
    def readable(self, *a, **k): return False

class _TimedOut(Exception):
    pass

def _alarm(signum, frame):
    raise _TimedOut("timed out")

def _guard():
    builtins.exit = None
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
                 "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod", "chown",
                 "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    subprocess.Popen = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None

verdict = "passed"
real_stdout = sys.stdout
try:
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        sys.stdin = _NoInput()
        _guard()
        exec(compile(source, "program.py", "exec"), {})
    signal.setitimer(signal.ITIMER_REAL, 0)
except _TimedOut:
    verdict = "timed out"
except BaseException as e:
    verdict = "failed: " + str(e)[:500]
real_stdout.write(json.dumps({"result": verdict}))
real_stdout.flush()
'''


def estimate_pass_at_k(num_samples: Sequence[int], num_correct: Sequence[int], k: int) -> np.ndarray:
    """Per problem, the unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k)."""

    def one(n: int, c: int) -> float:
        if n - c < k:
            return 1.0
        return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    return np.array([one(int(n), int(c)) for n, c in zip(num_samples, num_correct)])


class SandboxCodeEval:
    """``evaluate``'s ``code_eval`` metric (same ``compute`` arguments and return value), every
    program run in :mod:`rlkit.sandbox` by :data:`RUNNER`.

    ``compute(predictions=[[candidate, ...] per problem], references=[test per problem],
    k=[1, 10, 100], num_workers=4, timeout=3.0)`` -> ``({"pass@k": mean}, {problem: [(i, {"passed",
    "result"})]})``; ``pass@k`` only for the k every problem has samples for."""

    def __init__(self, limits: Any = None):
        self.limits = limits
        self.programs_run = 0

    def _limits(self, timeout: float) -> Any:
        from rlkit.sandbox import SandboxLimits

        if self.limits is not None:
            return self.limits
        # the runner's own timer is code_eval's limit; the sandbox's are the backstop (interpreter start included)
        return SandboxLimits(cpu_time_s=timeout + 2.0, wall_time_s=timeout + 3.0)

    def run(self, program: str, timeout: float = 3.0) -> Dict[str, Any]:
        """One program's verdict: ``{"passed": bool, "result": "passed" | "failed: ..." | "timed out"}``."""
        from rlkit.sandbox import run_program

        result = run_program(RUNNER, "", limits=self._limits(timeout), files=self._files(program, timeout))
        self.programs_run += 1
        return verdict_of(result)

    @staticmethod
    def _files(program: str, timeout: float) -> Dict[str, str]:
        return {"program.py": program, "timeout.txt": repr(float(timeout))}

    def compute(self, predictions: Sequence[Sequence[str]], references: Sequence[str], k: Sequence[int] = (1, 10, 100),
                num_workers: int = 4, timeout: float = 3.0) -> Tuple[Dict[str, float], Dict[int, List[Tuple[int, Dict[str, Any]]]]]:
        from rlkit.sandbox import SandboxPool

        if len(predictions) != len(references):
            raise ValueError(f"code_eval: {len(predictions)} prediction lists for {len(references)} references")
        programs = [(task, i, candidate + "\n" + test)
                    for task, (candidates, test) in enumerate(zip(predictions, references))
                    for i, candidate in enumerate(candidates)]
        results: Dict[int, List[Tuple[int, Dict[str, Any]]]] = {task: [] for task in range(len(references))}
        with SandboxPool(max(1, int(num_workers))) as pool:
            verdicts = [self._submit(pool, program, timeout) for _, _, program in programs]
            for (task, i, _), future in zip(programs, verdicts):
                results[task].append((i, verdict_of(future.result())))
        self.programs_run += len(programs)
        total = np.array([len(r) for r in results.values()])
        correct = np.array([sum(v["passed"] for _, v in r) for r in results.values()])
        ks = [k] if isinstance(k, int) else list(k)
        pass_at_k = {f"pass@{kk}": float(estimate_pass_at_k(total, correct, kk).mean()) for kk in ks if (total >= kk).all()}
        return pass_at_k, results

    def _submit(self, pool: Any, program: str, timeout: float) -> Any:
        return pool.submit(RUNNER, "", limits=self._limits(timeout), files=self._files(program, timeout))


def verdict_of(result: Any) -> Dict[str, Any]:
    """A sandbox :class:`~rlkit.sandbox.ExecutionResult` of :data:`RUNNER` as code_eval's verdict."""
    if result.verdict == "sandbox_error":
        from rlkit.sandbox import SandboxUnavailableError

        raise SandboxUnavailableError(f"the sandbox failed to run a program: {result.error or result.stderr.strip()[:200]}")
    try:
        said = json.loads(result.stdout.strip().splitlines()[-1])["result"] if result.stdout.strip() else None
    except (ValueError, KeyError, IndexError):
        said = None
    if said is None:  # killed before the runner could say (a sandbox limit: memory, output, wall clock)
        said = "timed out" if result.verdict == "timeout" else f"failed: {result.verdict}"
    return {"passed": said == "passed", "result": said}


# -- lm-eval's task modules, with code_eval swapped for the sandbox ---------------------------------


class _EvaluateStandIn(types.SimpleNamespace):
    """What ``import evaluate`` gives a task module here: ``load("code_eval")`` is the sandbox."""

    def __init__(self, code_eval: SandboxCodeEval):
        super().__init__()
        self._code_eval = code_eval

    def load(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name != "code_eval":
            from rlkit.errors import ConfigError

            raise ConfigError(f"a code task asked HF evaluate for metric {name!r}; rlkit eval provides only code_eval (sandboxed)")
        return self._code_eval


def _evaluate_imports(tree: ast.Module) -> Tuple[List[ast.stmt], Dict[str, str]]:
    """The module's top-level statements without its ``evaluate`` imports, and the names those
    imports bound (``hf_evaluate`` -> the module, ``load`` -> its ``load``)."""
    body, bound = [], {}
    for node in tree.body:
        if isinstance(node, ast.Import) and any(a.name == "evaluate" for a in node.names):
            bound.update({(a.asname or a.name): "module" for a in node.names if a.name == "evaluate"})
            rest = [a for a in node.names if a.name != "evaluate"]
            if rest:
                body.append(ast.Import(names=rest))
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "evaluate":
            bound.update({(a.asname or a.name): a.name for a in node.names})
            continue
        body.append(node)
    return body, bound


def uses_code_eval(path: Path) -> bool:
    """Whether lm-eval task module ``path`` imports ``evaluate`` and loads its ``code_eval``."""
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError:
        return False
    if "code_eval" not in source:
        return False
    return bool(_evaluate_imports(ast.parse(source))[1])


_modules: Dict[str, types.ModuleType] = {}
_lock = threading.Lock()
_CODE_EVAL: Optional[SandboxCodeEval] = None


def code_eval() -> SandboxCodeEval:
    """The process's :class:`SandboxCodeEval` (its ``programs_run`` counts every program scored)."""
    global _CODE_EVAL
    with _lock:
        if _CODE_EVAL is None:
            _CODE_EVAL = SandboxCodeEval()
        return _CODE_EVAL


def load_task_module(path: Path) -> types.ModuleType:
    """lm-eval task module ``path`` (a ``utils.py``) executed with ``evaluate`` replaced by the
    sandbox's stand-in; once per process. Its import-time self-check (a wrong ``add`` must fail)
    then runs in the sandbox too, so a sandbox that cannot run programs fails here, before any model loads."""
    key = str(Path(path).resolve())
    with _lock:
        if key in _modules:
            return _modules[key]
    tree = ast.parse(Path(key).read_text(encoding="utf-8"), filename=key)
    body, bound = _evaluate_imports(tree)
    stand_in = _EvaluateStandIn(code_eval())
    module = types.ModuleType(f"rlkit_harness_tasks.{Path(key).parent.name}.{Path(key).stem}")
    module.__file__ = key
    for name, what in bound.items():
        module.__dict__[name] = stand_in if what == "module" else getattr(stand_in, what)
    exec(compile(ast.Module(body=body, type_ignores=[]), key, "exec"), module.__dict__)  # noqa: S102 - lm-eval's own task file
    with _lock:
        return _modules.setdefault(key, module)
