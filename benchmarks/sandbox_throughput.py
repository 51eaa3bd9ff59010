"""Sandbox throughput and per-program overhead.

Runs a trivial program N times (a) bare, ``subprocess.run([python, "-c", src])``, with the
caller's interpreter and with the interpreter the sandbox uses, (b) through ``run_program`` one
at a time, (c) through a :class:`SandboxPool` of each worker count, and prints programs per
second, milliseconds per program and the ratio to the bare run. Not a test.

    python benchmarks/sandbox_throughput.py --n 200 --workers 1 2 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from rlkit.sandbox import SandboxLimits, SandboxPool, run_program, sandbox_status

SRC = "print(sum(range(1000)))"


def timed(fn, n: int) -> float:
    start = time.perf_counter()
    fn(n)
    return time.perf_counter() - start


def bare(python: str):
    def run(n: int) -> None:
        for _ in range(n):
            subprocess.run([python, "-c", SRC], check=True, stdout=subprocess.DEVNULL)
    return run


def sandboxed(n: int) -> None:
    for _ in range(n):
        res = run_program(SRC, limits=SandboxLimits())
        assert res.ok, res


def pooled(workers: int):
    def run(n: int) -> None:
        with SandboxPool(workers) as pool:
            results = list(pool.map([(SRC, "")] * n))
        assert all(r.ok for r in results)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100, help="programs per measurement")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    status = sandbox_status()  # the one-off self-check, kept out of the timings
    print(f"sandbox: isolation={status.isolation} python={status.python} "
          f"network_isolated={status.network_isolated} cpus={os.cpu_count()} n={args.n}\n")
    rows = [("bare subprocess.run (sys.executable)", timed(bare(sys.executable), args.n))]
    if os.path.realpath(status.python) != os.path.realpath(sys.executable):
        rows.append((f"bare subprocess.run ({status.python})", timed(bare(status.python), args.n)))
    base, same_py = rows[0][1], rows[-1][1]
    rows.append(("sandbox run_program, serial", timed(sandboxed, args.n)))
    for w in args.workers:
        rows.append((f"sandbox SandboxPool({w})", timed(pooled(w), args.n)))
    print(f"{'mode':<44} {'progs/s':>9} {'ms/prog':>9} {'x bare':>8} {'x bare same py':>15}")
    for name, secs in rows:
        print(f"{name:<44} {args.n / secs:>9.1f} {1000 * secs / args.n:>9.2f} "
              f"{secs / base:>8.2f} {secs / same_py:>15.2f}")
    print("\nx bare: time per program relative to the first row; x bare same py: relative to a bare"
          " run of the interpreter the sandbox uses. Pool rows run programs concurrently.")


if __name__ == "__main__":
    main()
