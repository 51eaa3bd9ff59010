"""A sandbox for untrusted, model-generated Python programs.

``run_program(source, stdin, limits=SandboxLimits(...))`` runs ``python3 -I -S main.py`` in a
fresh sandbox and returns an :class:`ExecutionResult` (verdict ``ok``, ``runtime_error``,
``timeout``, ``memory_limit``, ``output_limit``, ``killed`` or ``sandbox_error``; exit code or
signal; stdout/stderr capped; wall and CPU time). :class:`SandboxPool` runs many in parallel.

Protections in force (checked on Linux 6.18, Debian 12, running as root; see ``_launcher.py``):

* **Namespaces**: every program gets new mount, network, PID, IPC and UTS namespaces
  (``unshare(2)`` via ctypes; Python 3.11 has no ``os.unshare``). As root this needs no user
  namespace; as a non-root caller a user namespace is created too (``userns`` mode).
* **No network**: the new network namespace holds only a downed ``lo``; ``connect()`` to any
  address, including the host's ``127.0.0.1``, fails with ENETUNREACH. Abstract unix sockets
  are per-namespace too.
* **Unprivileged uid**: as root the program runs under a private uid/gid from
  ``2_000_000_000 + [0, 1e8)``, one per concurrent run (not ``nobody``: a shared uid would share
  RLIMIT_NPROC counts between concurrent runs and let them signal each other), with no
  supplementary groups and ``PR_SET_NO_NEW_PRIVS`` (setuid binaries cannot regain root). RLIMIT_NPROC
  is enforced because the uid is not 0. In ``userns`` mode the program is uid 1000 in a nested
  user namespace with no capabilities (RLIMIT_NPROC is counted per user namespace, kernel >= 5.14).
* **PID namespace**: the program's parent is a small init (pid 1); when the program exits, or
  the parent kills the init on a timeout, the kernel SIGKILLs every process left in the
  namespace, so double-forked/``setsid`` background processes cannot outlive the run. The host's
  processes (including the caller) are invisible: ``/proc`` is a fresh mount for the namespace,
  so the caller's environment and command line cannot be read, and ``kill()`` cannot reach them.
* **Filesystem**: every mount is made read-only and nosuid (``mount_setattr(AT_RECURSIVE)``),
  ``/tmp`` is a fresh size-capped tmpfs holding the work dir ``/tmp/work`` (the cwd, ``HOME`` and
  ``TMPDIR``; mode 0700, owned by the program's uid), ``/var/tmp`` and ``/run`` are empty
  root-owned tmpfs mounts (hiding host unix sockets), ``/dev/shm`` a private 1 MiB tmpfs. All
  of it vanishes with the namespace, so the work dir is removed even on a timeout. Writing
  anywhere on the host fails (EROFS/EACCES/ENOENT). (In ``userns`` mode the program also owns
  the private ``/tmp`` tmpfs.)
* **rlimits**: RLIMIT_CPU (SIGXCPU, SIGKILL a second later), RLIMIT_AS, RLIMIT_NPROC,
  RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0, RLIMIT_MEMLOCK=0, RLIMIT_MSGQUEUE=0.
* **Wall clock**: the parent enforces ``wall_time_s`` and tears the whole sandbox down (a
  backstop alarm in the init does it too if the parent dies).
* **Environment**: the program sees only ``PATH``, ``LANG``, ``LC_ALL``, ``HOME``, ``TMPDIR``;
  ``-I`` ignores ``PYTHON*`` variables (so string hashing is randomised per run), ``-S`` skips
  site-packages (programs get the standard library only).
* **Output**: stdout and stderr are read incrementally; past ``max_output_bytes`` the run is
  killed, the output truncated and the verdict ``output_limit``.

**Refuse if unprotected**: before the first program, :func:`ensure_available` runs a probe in
the sandbox (see :mod:`rlkit.sandbox.selfcheck`): the caller listens on ``127.0.0.1``, the probe
tries to connect and lists its interfaces; unless the connect failed, nothing arrived and only
``lo`` exists, or if namespaces cannot be created at all, :class:`SandboxUnavailableError` is
raised for this and every later call. ``allow_network=True`` opts out: if namespaces are
unavailable the program then runs with rlimits and the uid drop only (``isolation="none"``: no
network, PID or filesystem isolation, a host temp dir as work dir).

**Interpreter**: as root, the program's interpreter must be executable by the private uid; a
pyenv under ``/root`` (mode 0700) is not, so :func:`default_python` falls back to
``/usr/bin/python3``. The launcher itself runs under ``sys.executable``.

**Not covered**: no seccomp filter (all syscalls the kernel allows an unprivileged user);
no cgroup, so memory is bounded per process (RLIMIT_AS) times RLIMIT_NPROC, not in total, and CPU
time per process; the host kernel, ``/sys`` and world-readable files stay readable.
"""

from rlkit.sandbox.core import VERDICTS, ExecutionResult, SandboxLimits, SandboxUnavailableError
from rlkit.sandbox.pool import SandboxPool
from rlkit.sandbox.run import run_program
from rlkit.sandbox.selfcheck import SandboxStatus, default_python, ensure_available, sandbox_status

__all__ = [
    "VERDICTS",
    "ExecutionResult",
    "SandboxLimits",
    "SandboxPool",
    "SandboxStatus",
    "SandboxUnavailableError",
    "default_python",
    "ensure_available",
    "run_program",
    "sandbox_status",
]
