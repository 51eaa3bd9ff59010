"""Sweeps: ``rlkit train -m`` with any Hydra sweeper and launcher, and their reports.

- :mod:`rlkit.sweep.plan` — checks a sweep before it starts and says what Hydra gets;
- :mod:`rlkit.sweep.job` — one job as Hydra's task function runs it;
- :mod:`rlkit.sweep.objective` — the number each job returns to the sweeper, ``result.json``;
- :mod:`rlkit.sweep.report` — ``report.md`` / ``report.csv`` / ``report.png`` of a sweep directory.

``rlkit sweep report DIR`` (:func:`sweep_command`) writes and prints the report of any sweep
directory, including one whose sweep was killed.
"""

from __future__ import annotations

from typing import List

USAGE = "usage: rlkit sweep report DIR   (the table, CSV and plot of a sweep directory: runs/<recipe>/sweep-<time>)"


def sweep_command(argv: List[str]) -> int:
    from rlkit.errors import ConfigError
    from rlkit.sweep.report import summary, write_report

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] != "report" or len(argv) != 2:
        raise ConfigError(f"sweep: expected 'report DIR', got {' '.join(argv)!r}; {USAGE}")
    report = write_report(argv[1])
    print(summary(report), end="")
    return 0
