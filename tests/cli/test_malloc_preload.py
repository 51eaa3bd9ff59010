"""The rlkit command re-executes itself once with mimalloc preloaded (rlkit.malloc_preload): same
process id and exit code, LD_PRELOAD restored for its children, a missing named allocator one line
with exit 2. Fresh interpreters throughout (an allocator is chosen when a process starts)."""

import os
import subprocess
import sys

import pytest

from rlkit import malloc_preload

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD: Linux only"), pytest.mark.slow]

PROBE = r"""
import ctypes, os, subprocess, sys
from rlkit import malloc_preload as m
m.reexec_on_allocator()
child = subprocess.run([sys.executable, "-c", "from rlkit import malloc_preload as m; print(m.active())"],
                       capture_output=True, text=True).stdout.strip()
purge = ctypes.CDLL(m.library()).mi_option_get(15) if m.active() == "mimalloc" else None  # mi_option_purge_delay
print(os.getpid(), m.active(), repr(os.environ.get("LD_PRELOAD", "")), child, purge, os.environ.get("MIMALLOC_PURGE_DELAY"),
      sorted(k for k in os.environ if k.startswith("_RLKIT")))
raise SystemExit(7)
"""


def run_probe(**env):
    full = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MIMALLOC_PURGE_DELAY", malloc_preload.ENV)}
    full.update(env)
    proc = subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
    out, err = proc.communicate(timeout=60)
    return proc, out.strip().split(maxsplit=3), err


def test_the_bundled_mimalloc_is_found():
    lib = malloc_preload.bundled_mimalloc()
    assert lib and os.path.isfile(lib) and "libmimalloc.so" in lib
    assert malloc_preload.library("auto") == lib and malloc_preload.library("mimalloc") == lib
    assert malloc_preload.library("system") is None and malloc_preload.library("glibc") is None


def test_reexec_preloads_mimalloc_keeps_pid_and_exit_code_and_children_run_on_their_usual_malloc():
    for _ in range(2):  # twice: a fresh process each time
        proc, (pid, allocator, preload, rest), err = run_probe()
        child, purge, purge_env, markers = rest.split(" ", 3)
        assert proc.returncode == 7, err
        assert int(pid) == proc.pid  # exec, not a child process: signals and exit codes reach the same process
        assert allocator == "mimalloc" and purge == "-1"  # mimalloc started with rlkit's setting
        assert preload == "''" and child == "system" and purge_env == "None" and markers == "[]"  # the children: as before


def test_a_users_own_mimalloc_setting_wins():
    proc, (pid, allocator, preload, rest), err = run_probe(MIMALLOC_PURGE_DELAY="250")
    child, purge, purge_env, markers = rest.split(" ", 3)
    assert proc.returncode == 7 and allocator == "mimalloc" and purge == "250" and purge_env == "250", err


def test_a_users_own_ld_preload_is_kept_for_the_children(tmp_path):
    own = malloc_preload.bundled_mimalloc()  # any loadable library will do: the user's own preload
    proc, (pid, allocator, preload, rest), err = run_probe(LD_PRELOAD=own)
    assert proc.returncode == 7, err
    assert allocator == "mimalloc" and preload == repr(own)  # already loaded: no re-exec, nothing changed


def test_system_means_no_preload():
    proc, (pid, allocator, preload, rest), err = run_probe(RLKIT_ALLOCATOR="system")
    assert proc.returncode == 7 and allocator == "system" and preload == "''", err


def test_unknown_or_missing_allocators_are_one_line(monkeypatch):
    with pytest.raises(Exception, match="RLKIT_ALLOCATOR='tcmallocc': expected auto, mimalloc"):
        malloc_preload.library("tcmallocc")
    monkeypatch.setattr(malloc_preload.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(Exception, match=r"RLKIT_ALLOCATOR='jemalloc': not found \(apt-get install libjemalloc2\)"):
        malloc_preload.library("jemalloc")
    with pytest.raises(Exception, match="not found"):
        malloc_preload.library("/nonexistent/libfoo.so")


def test_the_rlkit_command_runs_on_mimalloc_and_refuses_a_missing_one_with_exit_2():
    rlkit = [sys.executable, "-m", "rlkit"]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    ok = subprocess.run([*rlkit, "--version"], capture_output=True, text=True, env={**env, "RLKIT_ALLOCATOR": "auto"}, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith("rlkit "), ok.stderr
    # `python -m rlkit` re-executes before the rest of rlkit loads: its modules are imported once, by the
    # re-executed process (-X importtime lists each module a process imports, on stderr)
    timed = subprocess.run([sys.executable, "-X", "importtime", *rlkit[1:], "--version"], capture_output=True, text=True,
                           env={**env, "RLKIT_ALLOCATOR": "auto"}, timeout=60)
    assert timed.returncode == 0 and timed.stdout.startswith("rlkit ")
    imported = [line.split("|")[-1].strip() for line in timed.stderr.splitlines() if line.startswith("import time:")]
    assert imported.count("rlkit.malloc_preload") == 2 and imported.count("rlkit.cli") == 1, imported.count("rlkit.cli")
    bad = subprocess.run([*rlkit, "--version"], capture_output=True, text=True, env={**env, "RLKIT_ALLOCATOR": "/nonexistent/lib.so"}, timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "RLKIT_ALLOCATOR='/nonexistent/lib.so': not found" in bad.stderr


SCRIPT = r"""
import os, subprocess, sys
print("top", flush=True)
import rlkit  # the script's own top-level import: re-executed once on mimalloc
from rlkit import malloc_preload as m
child = subprocess.run([sys.executable, "-c", "from rlkit import malloc_preload as m; print(m.active())"],
                       capture_output=True, text=True).stdout.strip()
print(os.getpid(), m.active(), repr(os.environ.get("LD_PRELOAD", "")), child, sorted(k for k in os.environ if k.startswith("_RLKIT")))
raise SystemExit(5)
"""


def run_script(tmp_path, source: str, *, module: bool = False, **env):
    (tmp_path / "my_loop.py").write_text(source)
    (tmp_path / "helper.py").write_text("import rlkit  # a library's import, not the script's\n")
    full = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MIMALLOC_PURGE_DELAY", malloc_preload.ENV)}
    full.update(env)
    argv = [sys.executable, "-m", "my_loop"] if module else [sys.executable, str(tmp_path / "my_loop.py")]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    return proc, out.strip().splitlines(), err


@pytest.mark.parametrize("module", [False, True], ids=["python my_loop.py", "python -m my_loop"])
def test_a_plain_python_script_runs_on_mimalloc_from_import_rlkit(tmp_path, module):
    """Issue 51 item 3a: ``python my_loop.py`` gets the ``rlkit`` command's allocator at ``import
    rlkit`` — same pid and exit code, children on their usual malloc, no marker left; what ran
    before the import ran twice (documented)."""
    proc, lines, err = run_script(tmp_path, SCRIPT, module=module)
    assert proc.returncode == 5, err
    assert lines[:2] == ["top", "top"]
    pid, allocator, preload, child, markers = lines[2].split(" ", 4)
    assert int(pid) == proc.pid and allocator == "mimalloc" and preload == "''" and child == "system" and markers == "[]"


def test_no_reexec_for_system_a_library_import_or_python_c(tmp_path):
    proc, lines, err = run_script(tmp_path, SCRIPT, RLKIT_ALLOCATOR="system")
    assert proc.returncode == 5 and lines[0] == "top" and lines[1].split()[1] == "system", err
    library_import = "print('top', flush=True)\nimport helper\nfrom rlkit import malloc_preload as m\nprint(m.active())\n"
    proc, lines, err = run_script(tmp_path, library_import)
    assert proc.returncode == 0 and lines == ["top", "system"], err
    proc = subprocess.run([sys.executable, "-c", "import rlkit; from rlkit import malloc_preload as m; print(m.active())"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "system", proc.stderr
