"""The sweep report from a directory alone (unit test: the run files are written by hand here; the
end-to-end sweeps in test_sweeps.py produce real ones): swept parameters are the keys that differ,
the best job follows the objective's direction, a job whose process is gone is "killed", a
failed job's error is listed, bad input is one line."""

import csv
import json
import math
import os
import socket
import subprocess
import sys

import yaml

from rlkit import cli
from rlkit.sweep.report import build_report, write_report


def job(sweep, num, overrides, metrics, result=None, loop="rl"):
    d = sweep / str(num)
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(
        yaml.safe_dump({"recipe": "r", "loop": loop, "sweep": {"objective": None, "direction": None}})
    )
    (d / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **m}) + "\n" for s, m in enumerate(metrics)))
    if result is not None:
        (d / "result.json").write_text(json.dumps({"job": num, "overrides": overrides, **result}))
    return d


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_report_of_a_sweep_with_a_killed_a_failed_and_a_best_job(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    done = {"status": "completed", "objective_key": "eval/greedy_accuracy", "direction": "maximize"}
    job(
        sweep,
        0,
        ["recipe=r", "train.learning_rate=0.001", "seed=0"],
        [{"eval/greedy_accuracy": 0.1}, {"eval/greedy_accuracy": 0.4}],
        {**done, "objective": 0.4},
    )
    job(
        sweep,
        1,
        ["recipe=r", "train.learning_rate=0.003", "seed=0"],
        [{"eval/greedy_accuracy": 0.1}, {"eval/greedy_accuracy": 0.7}],
        {**done, "objective": 0.7},
    )
    killed = job(sweep, 2, ["recipe=r", "train.learning_rate=0.01", "seed=0"], [{"eval/greedy_accuracy": 0.1}])
    (killed / ".lock").write_text(f"pid {dead_pid()} on {socket.gethostname()}, since 2026-01-01 00:00:00")  # RunLock's
    running = job(sweep, 5, ["recipe=r", "train.learning_rate=0.2", "seed=0"], [{"eval/greedy_accuracy": 0.2}])
    (running / ".lock").write_text(f"pid {os.getpid()} on {socket.gethostname()}, since 2026-01-01 00:00:00")
    job(
        sweep,
        3,
        ["recipe=r", "train.learning_rate=0.03", "seed=0"],
        [],
        {"status": "failed", "objective": None, "told": "-inf", "error": "data.train: 'x.jsonl' is empty"},
    )
    # no result.json and a released lock: a run that ended outside `rlkit train`
    job(sweep, 10, ["recipe=r", "train.learning_rate=0.1", "seed=0"], [{"eval/greedy_accuracy": 0.9}])
    (sweep / ".submitit").mkdir()  # a launcher's own folder is not a job
    refused = {
        "job": 4,
        "overrides": ["recipe=r", "train.learning_rate=0.05", "seed=0"],
        "error": "config key 'x': bad",
    }
    (sweep / "refused_jobs.jsonl").write_text(json.dumps(refused) + "\n")  # failed before its run directory was written

    report = build_report(sweep)
    assert [j.job for j in report.jobs] == ["0", "1", "2", "3", "4", "5", "10"]
    statuses = ["completed", "completed", "killed", "failed", "failed", "running", "ended"]
    assert [j.status for j in report.jobs] == statuses
    assert report.params == ["train.learning_rate"]  # recipe and seed are the same everywhere
    assert str(report.objective) == "eval/greedy_accuracy (maximize)"
    assert report.best.job == "1"  # 0.9 is job 10's value: not a recorded end
    assert report.jobs[2].objective == 0.1 and report.jobs[2].steps == 0 and report.jobs[3].objective is None

    write_report(sweep)
    md = (sweep / "report.md").read_text()
    assert "best: job 1 (train.learning_rate=0.003): eval/greedy_accuracy 0.7" in md
    assert "| 1 **best** | completed | 0.003 | 0.7 |" in md
    assert "- job 3 failed: data.train: 'x.jsonl' is empty" in md and "- job 4 failed: config key 'x': bad" in md
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert [r["status"] for r in rows] == statuses
    assert rows[1]["objective"] == "0.7" and rows[3]["error"] == "data.train: 'x.jsonl' is empty"
    assert (sweep / "report.png").read_bytes()[:4] == b"\x89PNG"

    assert cli.main(["sweep", "report", str(sweep)]) == 0
    assert "best: job 1" in capsys.readouterr().out


def test_minimised_objective_and_a_diverged_job(tmp_path):
    sweep = tmp_path / "s"
    base = {"objective_key": "eval/nll", "direction": "minimize"}
    job(
        sweep,
        0,
        ["model=tiny", "train.learning_rate=0.5"],
        [{"eval/nll": 3.0}],
        {**base, "status": "completed", "objective": 3.0},
        loop="sft",
    )
    job(
        sweep,
        1,
        ["model=tiny", "train.learning_rate=5"],
        [{"eval/nll": None}],
        {**base, "status": "diverged", "objective": "nan", "error": "eval/nll = nan"},
        loop="sft",
    )
    job(
        sweep,
        2,
        ["model=tiny", "train.learning_rate=0.05"],
        [{"eval/nll": 2.0}],
        {**base, "status": "completed", "objective": 2.0},
        loop="sft",
    )
    report = build_report(sweep)
    assert report.best.job == "2" and math.isnan(report.jobs[1].objective)
    assert [j.status for j in report.jobs] == ["completed", "diverged", "completed"]


def test_bad_report_input_is_one_line(tmp_path, capsys):
    assert cli.main(["sweep", "report", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"rlkit: error: sweep report: {tmp_path / 'nowhere'} is not a directory\n"
    assert cli.main(["sweep", "report", str(tmp_path)]) == 2
    assert "holds no jobs" in capsys.readouterr().err
    assert cli.main(["sweep", "plot", str(tmp_path)]) == 2
    assert "expected 'report DIR'" in capsys.readouterr().err
    assert cli.main(["sweep", "--help"]) == 0 and "usage: rlkit sweep report DIR" in capsys.readouterr().out
