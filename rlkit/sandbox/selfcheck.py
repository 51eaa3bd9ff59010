"""The refuse-if-unprotected check, run once per process before the first sandboxed program.

:func:`ensure_available` runs a probe program in the sandbox. The parent first opens a TCP
listener on ``127.0.0.1``; the probe tries to connect to it, lists its network interfaces
(``/proc/net/dev``), reports its uid and parent pid, and tries to write into a world-writable
directory the parent created outside the sandbox. The sandbox counts as network-isolated only if
the connect failed, no connection reached the listener, and the only interface is ``lo``. If
namespaces cannot be created or the network is reachable, :class:`SandboxUnavailableError` is
raised (and cached, so every later call raises too) unless the caller passed
``allow_network=True``, in which case programs run with rlimits and the uid drop only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from rlkit.sandbox.core import SandboxLimits, SandboxUnavailableError, execute

PROBE = r"""
import json, os, socket
res = {"uid": os.getuid(), "ppid": os.getppid()}
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(2.0)
try:
    s.connect(("127.0.0.1", %(port)d))
    res["connect"] = "connected"
except OSError as exc:
    res["connect"] = "%%s: %%s" %% (type(exc).__name__, exc)
try:
    with open("/proc/net/dev") as f:
        res["interfaces"] = sorted(l.split(":")[0].strip() for l in f.readlines()[2:])
except OSError:
    res["interfaces"] = None
try:
    with open(os.path.join(%(outside)r, "escaped.txt"), "w") as f:
        f.write("x")
    res["wrote_outside"] = True
except OSError:
    res["wrote_outside"] = False
res["visible_pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(json.dumps(res))
"""


@dataclass(frozen=True)
class SandboxStatus:
    """What the self-check observed. ``isolation``: ``root`` (namespaces + private uid),
    ``userns`` (namespaces via a user namespace, caller's uid outside), ``none`` (degraded)."""

    isolation: str
    python: str
    network_isolated: bool
    pid_namespace: bool
    readonly_root: bool
    uid_dropped: bool
    outside_write_blocked: bool
    probe: dict[str, Any] = field(default_factory=dict)


_lock = threading.Lock()
_cache: dict[tuple, Union[SandboxStatus, SandboxUnavailableError]] = {}


def ensure_available(python: Optional[str] = None, allow_network: bool = False) -> SandboxStatus:
    """Return the (cached) :class:`SandboxStatus`, or raise :class:`SandboxUnavailableError`."""
    key = (python, bool(allow_network))
    with _lock:
        if key not in _cache:
            try:
                _cache[key] = _probe(python or default_python(), allow_network)
            except SandboxUnavailableError as exc:
                _cache[key] = exc
        found = _cache[key]
    if isinstance(found, SandboxUnavailableError):
        raise found
    return found


def sandbox_status(python: Optional[str] = None, allow_network: bool = False) -> SandboxStatus:
    """Alias of :func:`ensure_available` for reporting which protections are in force."""
    return ensure_available(python, allow_network)


def _probe(python: str, allow_network: bool) -> SandboxStatus:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    outside = tempfile.mkdtemp(prefix="rlkit-selfcheck-")
    os.chmod(outside, 0o777)
    try:
        src = PROBE % {"port": listener.getsockname()[1], "outside": outside}
        limits = SandboxLimits(cpu_time_s=5, wall_time_s=20)
        res = execute(src, "", limits=limits, python=python)
        if res.verdict == "sandbox_error" and (res.error or "").startswith("unshare"):
            if not allow_network:
                raise SandboxUnavailableError(
                    f"sandbox refuses to run: cannot create namespaces ({res.error}); "
                    "network isolation is required (pass allow_network=True to run unisolated)")
            res = execute(src, "", limits=limits, python=python, allow_unisolated=True)
        if res.verdict != "ok":
            detail = res.error or res.stderr.strip()[-500:]
            raise SandboxUnavailableError(
                f"sandbox self-check with {python} failed ({res.verdict}): {detail}")
        try:
            arrived = listener.accept()[0]
            arrived.close()
            connection_arrived = True
        except BlockingIOError:
            connection_arrived = False
        wrote = os.path.exists(os.path.join(outside, "escaped.txt"))
    finally:
        listener.close()
        shutil.rmtree(outside, ignore_errors=True)
    probe = json.loads(res.stdout.strip().splitlines()[-1])
    network_isolated = (probe["connect"] != "connected" and not connection_arrived
                        and probe["interfaces"] == ["lo"])
    if not network_isolated and not allow_network:
        raise SandboxUnavailableError(
            "sandbox refuses to run: the network is reachable from inside "
            f"(connect: {probe['connect']}, interfaces: {probe['interfaces']})")
    return SandboxStatus(
        isolation=res.isolation or "none", python=python, network_isolated=network_isolated,
        pid_namespace=probe["ppid"] == 1,
        readonly_root=bool(res.details.get("readonly_root")),
        uid_dropped=probe["uid"] != os.getuid() or res.isolation == "userns",
        outside_write_blocked=not (wrote or probe["wrote_outside"]), probe=probe)


def _others_can_reach(path: str, need: int) -> bool:
    """Every ancestor directory is o+x and the path itself has ``need`` for others."""
    for p in {path, os.path.realpath(path)}:
        parts = os.path.abspath(p).split(os.sep)
        for i in range(1, len(parts)):
            parent = os.sep.join(parts[:i]) or os.sep
            try:
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    return False
            except OSError:
                return False
        try:
            if os.stat(p).st_mode & need != need:
                return False
        except OSError:
            return False
    return True


def default_python() -> str:
    """An interpreter the sandbox's unprivileged uid can execute.

    Not root: ``sys.executable`` (the program keeps the caller's uid). Root: the first of
    ``sys.executable``, the base interpreter, ``/usr/bin/python3``, ``/usr/local/bin/python3`` that
    others can execute (a pyenv under ``/root`` is not: ``/root`` is mode 0700).
    """
    if os.geteuid() != 0:
        return sys.executable
    stdlib = sysconfig.get_paths()["stdlib"]
    own = [sys.executable, getattr(sys, "_base_executable", None)]
    for cand in own + ["/usr/bin/python3", "/usr/local/bin/python3"]:
        if not cand or not os.path.isfile(cand):
            continue
        if not _others_can_reach(cand, stat.S_IXOTH | stat.S_IROTH):
            continue
        if cand in own and not _others_can_reach(stdlib, stat.S_IXOTH | stat.S_IROTH):
            continue
        return cand
    raise SandboxUnavailableError(
        "no Python interpreter is executable by the sandbox's unprivileged uid; pass python=...")
