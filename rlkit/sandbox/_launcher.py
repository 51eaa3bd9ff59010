"""Sandbox launcher: run as ``python -I -S _launcher.py CFG_FD STATUS_FD PARENT_PID`` by :mod:`rlkit.sandbox`.

Standalone on purpose (stdlib only, no rlkit import): the parent spawns it with an empty
environment, so the parent never has to run ``preexec_fn`` code in a multi-threaded process.

Process tree::

    parent (rlkit)  ->  L: this script (caller's uid)
                          unshare(NEWNS|NEWNET|NEWPID|NEWIPC|NEWUTS [|NEWUSER when not root])
                          -> A: pid 1 of the new PID namespace ("init")
                               private mounts: / read-only+nosuid (recursive), fresh /proc,
                               tmpfs /tmp (work dir /tmp/work), /dev/shm, /var/tmp, /run
                               -> B: rlimits, no_new_privs, drop to the sandbox uid, exec python

A reaps B, writes B's exit status and rusage to STATUS_FD and exits; the kernel then SIGKILLs
everything left in the PID namespace, so no process outlives the run. Each of L, A and B dies with
its parent (:func:`rlkit.lifetime.die_with_parent`, loaded by path: SIGKILL when the parent goes,
checked against a parent that died first), so a ``kill -9`` of rlkit takes the sandbox down too. SIGUSR1 to L (sent by the
parent on timeout/output overflow) makes L SIGKILL A, which tears the namespace down likewise.
Status lines are JSON objects with ``event`` = ``started`` | ``error`` | ``exit``.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_NO_NEW_PRIVS = 38
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 0x1, 0x2
INNER_UID = 1000  # the program's uid inside its own user namespace (non-root mode)

_libc = ctypes.CDLL(None, use_errno=True)
_status_fd = -1


def _load_lifetime():
    """rlkit/lifetime.py, loaded by path (this script imports nothing of rlkit: ``-I -S``)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lifetime.py")
    spec = importlib.util.spec_from_file_location("rlkit_lifetime", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lifetime = _load_lifetime()


def report(**record):
    try:
        os.write(_status_fd, (json.dumps(record) + "\n").encode())
    except OSError:
        pass


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {target}")


def prctl(option, arg):
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), "prctl")


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("attr_set", "attr_clr", "propagation", "userns_fd")]


def readonly_root():
    """Make every mount of this mount namespace read-only and nosuid (Linux >= 5.12)."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    ret = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE,
                        ctypes.byref(attr), ctypes.sizeof(attr))
    _check(0 if ret == 0 else -1, "mount_setattr /")


def write_id_maps(inside, outside_uid, outside_gid):
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inside} {outside_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inside} {outside_gid} 1")


def setup_mounts(cfg):
    """In A (new mount + PID namespace): read-only root, private /proc, tmpfs work dir."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    protections = {"readonly_root": True}
    try:
        readonly_root()
    except OSError as exc:  # old kernel: fall back to permission bits + the tmpfs mounts below
        protections["readonly_root"] = False
        report(event="warning", message=str(exc))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    flags = MS_NOSUID | MS_NODEV
    mount("tmpfs", "/tmp", "tmpfs", flags, f"size={int(cfg['tmpfs_bytes'])},mode=0755")
    for path, mode in (("/dev/shm", "1777"), ("/var/tmp", "0755"), ("/run", "0755")):
        if os.path.isdir(path) and not os.path.islink(path):
            mount("tmpfs", path, "tmpfs", flags | MS_NOEXEC, f"size=1048576,mode={mode}")
    return protections


def write_files(workdir, files, uid, gid):
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    os.chown(workdir, uid, gid)
    for name, text in files.items():
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chown(path, uid, gid)


def set_limits(lim):
    cpu = int(lim["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for name, value in (("RLIMIT_AS", lim["as_bytes"]), ("RLIMIT_NPROC", lim["nproc"]),
                        ("RLIMIT_FSIZE", lim["fsize_bytes"]), ("RLIMIT_NOFILE", lim["nofile"]),
                        ("RLIMIT_CORE", 0), ("RLIMIT_MEMLOCK", 0), ("RLIMIT_MSGQUEUE", 0)):
        resource.setrlimit(getattr(resource, name), (int(value), int(value)))


def exec_program(cfg, workdir, isolated, as_root, init_pid):
    """B: apply limits, drop privileges, exec the interpreter. Never returns."""
    try:
        set_limits(cfg["limits"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if as_root:
            os.setgroups([])
            os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
        elif isolated:  # root of a user namespace: nest one more so the program holds no caps
            unshare(CLONE_NEWUSER)
            write_id_maps(INNER_UID, 0, 0)
        lifetime.die_with_parent(init_pid)  # after the credential change, which clears it
        os.chdir(workdir)
        os.umask(0o077)
        argv = [cfg["python"], "-I", "-S", *cfg["argv"]]
        env = dict(cfg["env"], HOME=workdir, TMPDIR=workdir)
        os.execve(cfg["python"], argv, env)
    except BaseException as exc:  # noqa: BLE001 - report anything, then die
        report(event="error", stage="exec", message=f"{type(exc).__name__}: {exc}")
    os._exit(127)


def init(cfg, isolated, as_root, parent):
    """A: pid 1 of the sandbox (when isolated). Never returns."""
    try:
        # Isolated, our parent lies outside our PID namespace, so getppid() is 0; a launcher that
        # died before prctl() is then caught by the alarm backstop below instead.
        lifetime.die_with_parent(0 if isolated else parent)
        signal.signal(signal.SIGALRM, lambda *_: os._exit(137))  # backstop if the parent died
        signal.alarm(int(cfg["wall_s"]) + 3)
        if isolated:
            report(event="mounts", **setup_mounts(cfg))
            workdir = "/tmp/work"
        else:
            workdir = cfg["workdir"]
        uid, gid = (cfg["uid"], cfg["gid"]) if as_root else (os.getuid(), os.getgid())
        write_files(workdir, cfg["files"], uid, gid)
    except BaseException as exc:  # noqa: BLE001
        report(event="error", stage="setup", message=f"{type(exc).__name__}: {exc}")
        os._exit(70)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        exec_program(cfg, workdir, isolated, as_root, me)
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == child:
            break
    report(event="exit",
           code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
           signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
           cpu_s=usage.ru_utime + usage.ru_stime, maxrss_kb=usage.ru_maxrss)
    os._exit(0)


def main():
    global _status_fd
    cfg_fd, _status_fd, parent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.set_inheritable(_status_fd, False)
    chunks = []
    while True:
        chunk = os.read(cfg_fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(cfg_fd)
    cfg = json.loads(b"".join(chunks))
    as_root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    isolated = True
    try:
        unshare(flags if as_root else flags | CLONE_NEWUSER)
        if not as_root:
            write_id_maps(0, uid, gid)
    except OSError as exc:
        if not cfg["allow_unisolated"]:
            report(event="error", stage="unshare", message=str(exc))
            os._exit(70)
        isolated = False
    lifetime.die_with_parent(parent)  # after unshare (a new user namespace is new credentials)
    mode = ("root" if as_root else "userns") if isolated else "none"
    child = [None]

    def on_usr1(*_):
        if child[0] is not None:
            os.kill(child[0], signal.SIGKILL)
        if not isolated:  # no PID namespace to tear down: kill our whole process group
            os.killpg(0, signal.SIGKILL)

    signal.signal(signal.SIGUSR1, on_usr1)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        init(cfg, isolated, as_root, me)
    child[0] = pid
    report(event="started", isolation=mode, init_pid=pid)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # A stays a zombie: its pid is not reused
    child[0] = None
    _, status = os.waitpid(pid, 0)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
