"""``rlkit run SCRIPT.py`` / ``rlkit run -m MODULE`` (rlkit.run_script): a user's own loop runs as
``python`` would run it (``__main__``, argv, its directory on sys.path, its exit code, its
traceback) but on rlkit's allocator and Ctrl-C policy. Each case is a fresh ``python -m rlkit``."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit import malloc_preload

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import os, sys
import helper                                   # from the script's own directory
from rlkit import malloc_preload
print(__name__, sys.argv[1:], helper.WHERE, malloc_preload.active(), repr(os.environ.get("LD_PRELOAD", "")))
sys.exit(int(sys.argv[1]))
"""


def rlkit(*args, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", malloc_preload.ENV)}
    return subprocess.Popen([sys.executable, "-m", "rlkit", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.fixture
def scripts(tmp_path):
    loops = tmp_path / "loops"
    (loops / "pkg").mkdir(parents=True)
    (loops / "probe.py").write_text(PROBE)
    (loops / "helper.py").write_text("WHERE = 'beside-the-script'\n")
    (loops / "pkg" / "__init__.py").write_text("")
    (loops / "pkg" / "tool.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    (loops / "bad.py").write_text("def inner():\n    raise ValueError('boom')\n\ninner()\n")
    (loops / "slow.py").write_text(
        "import time\ntry:\n    print('ready', flush=True)\n    time.sleep(60)\nfinally:\n    print('cleanup ran', flush=True)\n"
    )
    return loops


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload: Linux only")
def test_a_script_runs_as_main_with_its_argv_exit_code_and_rlkit_allocator(scripts, tmp_path):
    code, out, err = finish(rlkit("run", str(scripts / "probe.py"), "5", "--flag", cwd=tmp_path))
    assert code == 5, err
    name, rest = out.split(" ", 1)
    assert name == "__main__"
    assert rest.split("] ", 1)[1].split() == ["beside-the-script", "mimalloc", "''"]  # preloaded; children get LD_PRELOAD back
    assert "['5', '--flag']" in rest


def test_a_module_a_missing_target_and_an_uncaught_exception(scripts, tmp_path):
    code, out, err = finish(rlkit("run", "-m", "pkg.tool", "x", cwd=scripts))
    assert (code, out.strip()) == (0, "__main__ ['x']"), err
    for args, message in ((("nope.py",), "rlkit: error: run: no such file 'nope.py'"),
                          (("-m", "nope.mod"), "rlkit: error: run -m nope.mod: no module named 'nope.mod'"),
                          (("pkg",), "rlkit: error: run: 'pkg' is a directory without a __main__.py")):
        code, out, err = finish(rlkit("run", *args, cwd=scripts))
        assert code == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1, (args, err)
    code, out, err = finish(rlkit("run", "bad.py", cwd=scripts))
    assert code == 1 and err.rstrip().endswith("ValueError: boom"), err
    frames = [line for line in err.splitlines() if line.strip().startswith("File ")]
    assert frames and all("bad.py" in f for f in frames), err  # the script's frames only, as python shows them


def test_ctrl_c_runs_the_scripts_cleanup_then_exits_130(scripts, tmp_path):
    for _ in range(2):
        proc = rlkit("run", str(scripts / "slow.py"), cwd=tmp_path, start_new_session=True)
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc, timeout=30)
        assert code == 130 and out.strip() == "cleanup ran", (code, out, err)
        assert err.strip().splitlines()[-1] == "rlkit: error: interrupted" and "Traceback" not in err, err


def test_the_quickstart_loop_runs_under_rlkit_run(tmp_path):
    code, out, err = finish(rlkit("run", str(ROOT / "examples" / "quickstart.py"), "--model", "tiny", "--steps", "2", cwd=tmp_path))
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["step 0", "step 1"]
    assert any(line.startswith("sample 0 (") for line in lines) and lines[-1].startswith("tokens: prefill")
