"""Hostile programs: each is contained, scored 0 with the reason, and leaves nothing behind.

Each program prints the expected answer only if its attack worked, so a reward of 0 shows the
attack failed; the host side is checked independently (listener, files, signals, processes).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from rlkit.rewards.code import CodeExecutionReward
from rlkit.sandbox import SandboxLimits, SandboxPool, run_program, sandbox_status

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

UID_LO, UID_HI = 2_000_000_000, 2_100_000_000  # the sandbox's private uid range
LIMITS = SandboxLimits(cpu_time_s=1, wall_time_s=4, memory_bytes=256 << 20, max_processes=16,
                       max_output_bytes=64 << 10)


def sandbox_processes(per_uid: bool = False):
    """Host pids running under a sandbox uid, started by this test process (pytest-xdist's other
    worker runs sandboxes of its own meanwhile, under other uids of the same range), alive together;
    with ``per_uid``, ``{uid: count}`` — RLIMIT_NPROC holds per uid.

    The /proc scan is not atomic: under a fork bomb, processes exit and others are forked while it
    reads, so the scan alone can list more processes than were ever alive at once. Those still
    present after the scan were all alive at the first re-check (each existed since it was listed,
    before any re-check), so the count returned is a true simultaneous count."""
    seen: dict[int, tuple[int, int]] = {}  # pid -> (uid, parent pid)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if line.startswith(("Uid:", "PPid:")))
            seen[int(pid)] = (int(fields["Uid"].split()[0]), int(fields["PPid"].split()[0]))
        except (OSError, KeyError, ValueError):
            continue

    def ours(pid: int) -> bool:
        for _ in range(64):
            pid = seen.get(pid, (0, 0))[1]
            if pid == os.getpid():
                return True
            if pid <= 1:
                return False
        return False

    found = [pid for pid, (uid, _) in seen.items() if UID_LO <= uid < UID_HI and ours(pid)]
    alive = [pid for pid in found if os.path.exists(f"/proc/{pid}")]
    if not per_uid:
        return alive
    counts: dict[int, int] = {}
    for pid in alive:
        counts[seen[pid][0]] = counts.get(seen[pid][0], 0) + 1
    return counts


def processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind(monkeypatch):
    """No sandboxed process and none of the temp folders the sandbox made (recorded as it makes
    them: other rlkit processes on this machine may be making their own meanwhile) outlive a test."""
    assert sandbox_status().network_isolated  # refuses (raises) otherwise
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args, **kwargs):
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    assert sandbox_processes() == []
    yield made
    assert sandbox_processes() == [], "a sandboxed process outlived its run"
    assert [d for d in made if os.path.exists(d)] == [], "a sandbox temp dir was left behind"
    assert subprocess.run(["true"]).returncode == 0  # the host can still spawn processes


@pytest.fixture(scope="module")
def reward():
    with SandboxPool(2) as pool:
        yield CodeExecutionReward(limits=LIMITS, pool=pool)


def grade(reward, source: str, expected: str = "escaped"):
    problem = {"tests": {"inputs": [""], "outputs": [expected]}}
    result = reward(f"Here you go:\n```python\n{source}\n```\n", problem)
    assert result.metrics["has_code"] == 1.0
    return result, result.info["tests"][0]


def test_infinite_loop_times_out(reward):
    result, case = grade(reward, "while True:\n    pass\nprint('escaped')")
    assert result.reward == 0.0 and case["verdict"] == "timeout"
    assert result.metrics["timeout_fraction"] == 1.0


def test_sleeping_program_hits_wall_clock():
    start = time.monotonic()
    res = run_program("import time\ntime.sleep(60)", limits=LIMITS)
    assert res.verdict == "timeout" and time.monotonic() - start < LIMITS.wall_time_s + 2


def test_fork_bomb_is_bounded_and_reaped(reward):
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], *sandbox_processes(per_uid=True).values(), 0)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        src = ("import os\nfor _ in range(10**6):\n    try:\n        os.fork()\n"
               "    except OSError:\n        pass\nprint('escaped')")
        result, case = grade(reward, src)
    finally:
        done.set()
        sampler.join()
    assert result.reward == 0.0 and case["verdict"] in ("timeout", "runtime_error", "killed")
    assert 0 < peak[0] <= LIMITS.max_processes  # RLIMIT_NPROC held (it is not enforced for uid 0)


def test_memory_exhaustion(reward):
    src = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))\nprint('escaped')"
    result, case = grade(reward, src)
    assert result.reward == 0.0
    assert case["verdict"] == "memory_limit" or "MemoryError" in (case["error"] or "")


def test_huge_output_is_capped(reward):
    src = "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)"
    result, case = grade(reward, src, expected="y")
    assert result.reward == 0.0 and case["verdict"] == "output_limit"
    res = run_program(src, limits=LIMITS)
    assert res.verdict == "output_limit" and res.truncated
    assert len(res.stdout) == LIMITS.max_output_bytes


def test_network_connection_does_not_arrive(reward):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        src = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
               "s.sendall(b'hello')\nprint('escaped')")
        result, case = grade(reward, src)
        assert result.reward == 0.0 and case["verdict"] == "runtime_error"
        assert "Network is unreachable" in case["error"]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing reached the host
    finally:
        listener.close()


def test_write_outside_workdir_fails(reward, tmp_path):
    target_dir = tempfile.mkdtemp(prefix="hostile-target-", dir="/var/tmp")
    os.chmod(target_dir, 0o777)  # even a world-writable host dir must be out of reach
    try:
        for path in (os.path.join(target_dir, "pwned"), os.path.join(os.getcwd(), "pwned"),
                     os.path.expanduser("~/pwned"), str(tmp_path / "pwned")):
            src = f"with open({path!r}, 'w') as f:\n    f.write('x')\nprint('escaped')"
            result, case = grade(reward, src)
            assert result.reward == 0.0 and case["verdict"] == "runtime_error", path
            assert not os.path.exists(path), path
        # inside its own work dir (cwd, $TMPDIR) writing works
        res = run_program("import os, tempfile\nopen('a', 'w').write('1')\n"
                          "print(tempfile.gettempdir() == os.getcwd())", limits=LIMITS)
        assert res.verdict == "ok" and res.stdout.strip() == "True"
    finally:
        os.rmdir(target_dir)


def test_parent_environment_is_invisible(reward, monkeypatch):
    monkeypatch.setenv("RLKIT_TEST_SECRET", "hunter2-secret")
    src = ("import os\nfound = os.environ.get('RLKIT_TEST_SECRET')\n"
           f"try:\n    found = found or open('/proc/{os.getpid()}/environ').read()\n"
           "except OSError:\n    pass\nprint(found)")
    result, case = grade(reward, src, expected="hunter2-secret")
    assert result.reward == 0.0 and case["verdict"] == "wrong_answer"
    assert "hunter2" not in case["output"]
    res = run_program("import os\nprint(sorted(os.environ))", limits=LIMITS)
    assert res.stdout.strip() == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"


def test_signalling_the_parent_fails(reward):
    received = []
    previous = signal.signal(signal.SIGTERM, lambda *a: received.append(a))
    try:
        src = ("import os, signal\nerrors = []\n"
               f"for target, sig in (({os.getpid()}, signal.SIGTERM), (-1, signal.SIGKILL)):\n"
               "    try:\n        os.kill(target, sig)\n"
               "    except OSError as exc:\n        errors.append(type(exc).__name__)\n"
               "print('escaped' if not errors else errors)")
        result, case = grade(reward, src)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.reward == 0.0 and case["verdict"] == "wrong_answer"
    assert "ProcessLookupError" in case["output"]  # the host pid does not exist in there
    assert received == []


def test_background_processes_do_not_survive(reward):
    marker = "31.4159"  # unique sleep duration to find the process by its command line
    src = ("import os, subprocess\n"
           "if os.fork() == 0:\n    os.setsid()\n"
           f"    subprocess.Popen(['sleep', '{marker}'], stdout=subprocess.DEVNULL,\n"
           "                     stderr=subprocess.DEVNULL, start_new_session=True)\n"
           "    os._exit(0)\n"
           "os.wait()\nprint('started')")
    result, case = grade(reward, src, expected="sleep still running")
    assert result.reward == 0.0 and case["verdict"] == "wrong_answer"
    assert case["output"].strip() == "started"  # the double fork did happen inside
    assert processes_with(f"sleep\0{marker}") == []


def test_privileges_are_dropped():
    src = ("import os, shutil, subprocess\nprint(os.getuid(), os.geteuid(), os.getgroups())\n"
           "su = shutil.which('su')\n"
           "print(su and subprocess.run([su, '-c', 'id -u'], capture_output=True,"
           " stdin=subprocess.DEVNULL, timeout=3).stdout)")
    res = run_program(src, limits=LIMITS)
    assert res.verdict == "ok", res.stderr
    first, second = res.stdout.splitlines()
    uid, euid = map(int, first.split()[:2])
    assert uid != 0 and euid != 0 and first.endswith("[]")
    assert second in ("None", "b''")  # su (setuid root) cannot regain root: no_new_privs+nosuid


def test_the_leftover_check_sees_the_sandbox_own_temp_dirs(nothing_left_behind):
    """The fixture records the folders the sandbox makes (an unisolated run makes one on the host)."""
    import sys

    from rlkit.sandbox.core import execute

    execute("print(6 * 7)", "", limits=LIMITS, python=sys.executable, allow_unisolated=True)  # the verdict is not the point
    assert len(nothing_left_behind) == 1 and os.path.basename(nothing_left_behind[0]).startswith("rlkit-sandbox-")
