"""The sandbox's ordinary behaviour: results, limits, the pool, the self-check's refusal logic."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import rlkit.sandbox.selfcheck as selfcheck
from rlkit.errors import InvalidInputError, RlkitError
from rlkit.sandbox import (
    ExecutionResult,
    SandboxLimits,
    SandboxPool,
    SandboxUnavailableError,
    run_program,
    sandbox_status,
)

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

FAST = SandboxLimits(cpu_time_s=2, wall_time_s=5)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_status_reports_protections():
    st = sandbox_status()
    assert st.network_isolated and st.pid_namespace and st.uid_dropped
    assert st.outside_write_blocked
    assert st.isolation in ("root", "userns")
    assert st.probe["interfaces"] == ["lo"] and st.probe["visible_pids"] == [1, 2]
    if st.isolation == "root":
        assert 2_000_000_000 <= st.probe["uid"] < 2_100_000_000


def test_ok_run_with_stdin():
    res = run_program("import sys\ndata = sys.stdin.read()\nprint(data.upper(), end='')",
                      "hello\nworld\n", limits=FAST)
    assert res.verdict == "ok" and res.ok and res.exit_code == 0 and res.signal is None
    assert res.stdout == "HELLO\nWORLD\n" and res.stderr == "" and not res.truncated
    assert 0 < res.wall_time_s < 5 and res.cpu_time_s is not None and res.cpu_time_s < 2


def test_large_stdin_is_streamed_and_ignored_stdin_is_fine():
    big = "x" * (8 << 20)
    res = run_program("import sys\nprint(len(sys.stdin.read()))", big, limits=FAST)
    assert res.verdict == "ok" and res.stdout.strip() == str(len(big))
    res = run_program("print('no read')", big, limits=FAST)
    assert res.verdict == "ok" and res.stdout.strip() == "no read"


def test_runtime_errors_exit_codes_and_signals():
    res = run_program("raise ValueError('boom')", limits=FAST)
    assert res.verdict == "runtime_error" and res.exit_code == 1 and "ValueError: boom" in res.stderr
    res = run_program("import sys\nsys.exit(3)", limits=FAST)
    assert res.verdict == "runtime_error" and res.exit_code == 3
    res = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", limits=FAST)
    assert res.verdict == "runtime_error" and res.signal == signal.SIGSEGV
    res = run_program("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", limits=FAST)
    assert res.verdict == "killed" and res.signal == signal.SIGKILL


def test_cpu_limit_gives_timeout_with_cpu_time():
    res = run_program("while True:\n    pass", limits=SandboxLimits(cpu_time_s=1, wall_time_s=10))
    # SIGXCPU (not the wall-clock SIGKILL) proves the CPU limit fired; the reported CPU time is the
    # launcher's reading and the wall time stretches on a loaded machine, so both get loose bounds
    assert res.verdict == "timeout" and res.signal == signal.SIGXCPU
    assert 0.3 <= res.cpu_time_s < 3 and res.wall_time_s < 10


def test_file_size_open_files_and_tmpfs_limits():
    limits = SandboxLimits(max_file_bytes=1 << 20, max_open_files=16, tmpfs_bytes=4 << 20)
    res = run_program("open('big', 'wb').write(b'x' * (2 << 20))", limits=limits)
    assert res.verdict == "runtime_error" and "File too large" in res.stderr
    res = run_program("fs = [open('f%d' % i, 'w') for i in range(64)]", limits=limits)
    assert res.verdict == "runtime_error" and "Too many open files" in res.stderr
    res = run_program("for i in range(8):\n    open('f%d' % i, 'wb').write(b'x' * (1 << 20))",
                      limits=limits)
    assert res.verdict == "runtime_error" and "No space left" in res.stderr


def test_workdir_is_fresh_and_private_per_run():
    first = run_program("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())",
                        limits=FAST)
    second = run_program("import os\nprint(os.listdir('.'), oct(os.stat('.').st_mode & 0o777))",
                         limits=FAST)
    assert first.stdout.strip() == "/tmp/work"
    assert second.stdout.strip() == "['main.py'] 0o700"


def test_pool_runs_in_parallel_and_keeps_order():
    src = "import sys, time\ntime.sleep(0.5)\nprint(sys.stdin.read().strip())"
    with SandboxPool(4, limits=FAST) as pool:
        start = time.monotonic()
        results = list(pool.map([(src, str(i)) for i in range(8)]))
        elapsed = time.monotonic() - start
        future = pool.submit("print(1)")
        assert isinstance(future.result(), ExecutionResult)
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]
    assert elapsed < 8 * 0.5  # overlapping, not serial


def test_invalid_arguments():
    with pytest.raises(InvalidInputError):
        SandboxLimits(cpu_time_s=0)
    with pytest.raises(InvalidInputError):
        SandboxLimits(memory_bytes=1 << 20)
    with pytest.raises(InvalidInputError):
        SandboxPool(0)
    with pytest.raises(InvalidInputError):
        run_program(b"print(1)", limits=FAST)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        run_program("print(1)", limits=FAST, files={"../x": ""})


def _fake_execute(outcomes):
    calls = []

    def execute(src, stdin, *, limits, python, allow_unisolated=False, files=None):
        calls.append(allow_unisolated)
        return outcomes[len(calls) - 1]

    return execute, calls


def test_refuses_when_namespaces_are_unavailable(monkeypatch):
    failed = ExecutionResult("sandbox_error", error="unshare: [Errno 1] Operation not permitted")
    fake, calls = _fake_execute([failed])
    monkeypatch.setattr(selfcheck, "execute", fake)
    with pytest.raises(SandboxUnavailableError, match="cannot create namespaces") as info:
        selfcheck._probe(sys.executable, allow_network=False)
    assert isinstance(info.value, RlkitError) and calls == [False]

    probe_out = ('{"uid": 5, "ppid": 77, "connect": "connected", "interfaces": ["eth0", "lo"],'
                 ' "wrote_outside": false, "visible_pids": [1]}\n')
    degraded = ExecutionResult("ok", exit_code=0, stdout=probe_out, isolation="none")
    fake, calls = _fake_execute([failed, degraded])
    monkeypatch.setattr(selfcheck, "execute", fake)
    st = selfcheck._probe(sys.executable, allow_network=True)  # explicit opt-out: runs degraded
    assert calls == [False, True] and st.isolation == "none" and not st.network_isolated


def test_refuses_when_network_is_reachable(monkeypatch):
    probe_out = ('{"uid": 5, "ppid": 1, "connect": "connected", "interfaces": ["eth0", "lo"],'
                 ' "wrote_outside": false, "visible_pids": [1, 2]}\n')
    fake, _ = _fake_execute([ExecutionResult("ok", exit_code=0, stdout=probe_out)])
    monkeypatch.setattr(selfcheck, "execute", fake)
    with pytest.raises(SandboxUnavailableError, match="network is reachable"):
        selfcheck._probe(sys.executable, allow_network=False)


def test_refusal_is_cached(monkeypatch):
    calls = []

    def probe(python, allow_network):
        calls.append(python)
        raise SandboxUnavailableError("no namespaces")

    monkeypatch.setattr(selfcheck, "_cache", {})
    monkeypatch.setattr(selfcheck, "_probe", probe)
    for _ in range(3):
        with pytest.raises(SandboxUnavailableError, match="no namespaces"):
            run_program("print(1)", limits=FAST, python="/nonexistent/python")
    assert calls == ["/nonexistent/python"]


NONROOT_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from rlkit.sandbox import SandboxLimits, run_program, sandbox_status
from rlkit.sandbox.core import SandboxUnavailableError
try:
    st = sandbox_status()
except SandboxUnavailableError as exc:  # no user namespaces: the sandbox must refuse, not run unprotected
    print(json.dumps({"refused": str(exc)}))
    sys.exit(0)
lim = SandboxLimits(cpu_time_s=1, wall_time_s=3, max_processes=8)
bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
net = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"
out = {"isolation": st.isolation, "net": st.network_isolated, "pidns": st.pid_namespace,
       "ok": run_program("print(6 * 7)", limits=lim).stdout.strip(),
       "bomb": run_program(bomb, limits=lim).verdict, "conn": run_program(net, limits=lim).verdict}
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv")
                    or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to become nobody), setpriv and /usr/bin/python3")
def test_non_root_caller_uses_a_user_namespace():
    """A non-root caller (here: nobody) gets the same isolation through a user namespace."""
    tree = tempfile.mkdtemp(prefix="sandbox-nonroot-")
    try:
        os.makedirs(os.path.join(tree, "rlkit"))
        open(os.path.join(tree, "rlkit", "__init__.py"), "w").close()
        for name in ("errors.py", "lifetime.py"):  # the launcher loads lifetime.py by path
            shutil.copy(os.path.join(REPO, "rlkit", name), os.path.join(tree, "rlkit"))
        shutil.copytree(os.path.join(REPO, "rlkit", "sandbox"), os.path.join(tree, "rlkit", "sandbox"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chmod", "-R", "a+rX", tree], check=True)
        script = os.path.join(tree, "probe.py")
        with open(script, "w") as f:
            f.write(NONROOT_SCRIPT)
        os.chmod(script, 0o644)
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             "/usr/bin/python3", "-I", script, tree],
            capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        import json

        out = json.loads(proc.stdout.strip().splitlines()[-1])
        userns = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-U", "-n", "true"],
                                capture_output=True, cwd="/").returncode == 0
        if not userns:  # this kernel forbids unprivileged user namespaces: the sandbox must refuse
            assert "refuses to run" in out["refused"] and "namespaces" in out["refused"], out
            return
        assert out == {"isolation": "userns", "net": True, "pidns": True, "ok": "42",
                       "bomb": "timeout", "conn": "runtime_error"}
    finally:
        shutil.rmtree(tree, ignore_errors=True)
