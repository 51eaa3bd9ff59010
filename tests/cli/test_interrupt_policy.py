"""The rlkit command's Ctrl-C policy (rlkit.interrupts), in subprocesses, repeatedly: the first
SIGINT raises KeyboardInterrupt, the second only cancels queued local work (it never raises, so it
cannot leave a lock held mid-cleanup), the third exits 130 at once."""

import signal
import subprocess
import sys
import time

SCRIPT = r"""
import sys, time
from rlkit import interrupts
from rlkit.backends.local import workers
assert interrupts.install()
try:
    print("ready", flush=True)            # inside the try: a SIGINT right after it is the first Ctrl-C too
    time.sleep(60)
except KeyboardInterrupt:
    print("first", flush=True)
    deadline = time.time() + 60           # a slow cleanup: only a signal can end it early
    while time.time() < deadline:
        if workers._abandoned.is_set():
            print("abandoned", flush=True)
            workers._abandoned.clear()    # report once
        time.sleep(0.01)
sys.exit(0)
"""


def _start():
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_three_ctrl_c_stop_cleanly_then_cancel_queued_then_quit_130():
    for _ in range(3):
        proc = _start()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "first"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "abandoned"  # the second raised nothing: cleanup went on
        assert proc.poll() is None
        started = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, (proc.returncode, err)
        assert time.time() - started < 10  # at once, not after the 60 s cleanup
        lines = err.strip().splitlines()
        assert lines[-1] == "rlkit: error: interrupted" and "Traceback" not in err, err
        assert "interrupted again: queued operations cancelled" in err


def test_an_application_handler_is_kept():
    code = (
        "import signal\nfrom rlkit import interrupts\n"
        "mine = lambda *a: None\nsignal.signal(signal.SIGINT, mine)\n"
        "assert not interrupts.install() and signal.getsignal(signal.SIGINT) is mine\nprint('kept')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "kept", proc.stderr


def test_abandoned_queue_skips_queued_operations_and_finishes_the_running_one():
    import threading

    from rlkit.backends.local import workers

    worker = workers.OrderedWorker("abandon-test")
    gate, ran = threading.Event(), []
    first = worker.submit(lambda: gate.wait(30) and ran.append("first"), operation="first")
    queued = [worker.submit(lambda i=i: ran.append(i), operation=f"op{i}") for i in range(3)]
    time.sleep(0.05)
    try:
        workers._abandoned.set()
        gate.set()
        first.result(10)
        worker.close(wait=True)
        assert ran == ["first"] and all(f.cancelled() for f in queued)
    finally:
        workers._abandoned.clear()
        workers._interrupted.clear()
