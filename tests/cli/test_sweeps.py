"""`rlkit train -m` with Hydra's real plugins on the tiny model (subprocesses, CPU, 1 step a job):
an Optuna sweep over interval() and choice() optimises the objective each job returns and ends
with the report; a trial that fails at run time fails alone; joblib runs two jobs at once and
submitit-local runs them as its own jobs, each in its run directory of one sweep directory; jobs
of a sweep share a W&B group; a killed sweep's job is reported as killed and resumes into its own
directory."""

import csv
import json
import math
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlkit import cli
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

FAST = ["recipe=sft_gsm8k_smoke", "train.steps=1", "train.generate.examples=0", "data.eval.limit=2"]


def rlkit(*args, cwd, env=None, timeout=240):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return warm_rlkit.run(args, cwd=cwd, env=full_env, timeout=timeout)


def result(job_dir):
    return json.loads((job_dir / "result.json").read_text())


def last(job_dir, key):
    values = [r[key] for r in map(json.loads, (job_dir / "metrics.jsonl").read_text().splitlines()) if key in r]
    return values[-1]


def test_optuna_sweep_over_interval_and_choice_returns_the_objective_and_writes_the_report(
    tmp_path, capsys, monkeypatch
):
    proc = rlkit(
        "train",
        "-m",
        *FAST,
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.sampler.seed=0",
        "train.learning_rate=tag(log, interval(1e-4, 1e-2))",
        "model.rank=choice(2,4)",
        "run_dir=opt",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    sweep = tmp_path / "opt"
    jobs = [sweep / str(i) for i in range(3)]
    objectives = []
    for job in jobs:
        r, config = result(job), yaml.safe_load((job / "config.yaml").read_text())
        assert r["status"] == "completed" and r["objective_key"] == "eval/nll" and r["direction"] == "minimize"
        assert r["objective"] == r["told"] == pytest.approx(last(job, "eval/nll"), rel=1e-12)
        assert 1e-4 <= config["train"]["learning_rate"] <= 1e-2 and config["model"]["rank"] in (2, 4)
        objectives.append(r["objective"])
    # what Optuna optimised is what the jobs returned
    optuna = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert optuna["best_value"] == pytest.approx(min(objectives), rel=1e-12)
    best = objectives.index(min(objectives))
    assert "Directions: ['minimize']" in proc.stdout
    # the report: the table, the CSV, the plot, the best job named (printed and in report.md)
    best_line = f"best: job {best} (train.learning_rate="
    assert best_line in proc.stdout and f"eval/nll {min(objectives):.4g}, in opt/{best}" in proc.stdout
    md = (sweep / "report.md").read_text()
    assert "| job | status | train.learning_rate | model.rank | eval/nll |" in md and best_line in md
    assert md.count("| completed |") == 3 and "![objective against each swept parameter](report.png)" in md
    rows = list(csv.DictReader((sweep / "report.csv").open()))
    assert [r["job"] for r in rows] == ["0", "1", "2"] and [float(r["objective"]) for r in rows] == objectives
    assert {r["model.rank"] for r in rows} <= {"2", "4"}
    assert (sweep / "report.png").read_bytes()[:4] == b"\x89PNG"
    # `rlkit sweep report` rebuilds the same table from the directory alone
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "report", "opt"]) == 0
    assert best_line in capsys.readouterr().out and (sweep / "report.md").read_text() == md


def test_a_trial_that_fails_at_run_time_fails_alone_in_one_line(tmp_path):
    """Grid sampling over a choice whose second value only fails once the run reads its data (the
    file exists; its first row is malformed): that trial is told +inf (Optuna records it, the
    sweep goes on), the report says why, the command ends with exit code 1."""
    good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"})
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "3+4?", "answer": 7}) + "\n" + good + "\n")
    proc = rlkit(
        "train",
        "-m",
        *FAST,
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.n_trials=2",
        "data.train.path=choice(gsm8k/train.jsonl,bad.jsonl)",
        "run_dir=grid",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    sweep = tmp_path / "grid"
    (ok_dir,) = [d for d in sweep.iterdir() if (d / "result.json").exists()]
    ok = result(ok_dir)
    assert (
        ok["status"] == "completed"
        and math.isfinite(ok["told"])
        and "data.train.path=gsm8k/train.jsonl" in ok["overrides"]
    )
    # the bad trial was refused before its run started: its directory is left unwritten (removed),
    # and the sweep directory's refused_jobs.jsonl says why
    (bad,) = [json.loads(x) for x in (sweep / "refused_jobs.jsonl").read_text().splitlines()]
    assert bad["status"] == "failed" and bad["told"] == "inf" and "data.train.path=bad.jsonl" in bad["overrides"]
    assert "bad.jsonl:1: field 'answer' must be str, got int" in bad["error"] and not Path(bad["dir"]).exists()
    failed_lines = [ln for ln in proc.stderr.splitlines() if "failed:" in ln and "the sweeper is told inf" in ln]
    assert len(failed_lines) == 1 and "(the worst for eval/nll (minimize))" in failed_lines[0]
    assert proc.stderr.strip().splitlines()[-1].startswith("rlkit: error: 1 of 2 jobs failed")
    assert yaml.safe_load((tmp_path / "grid" / "optimization_results.yaml").read_text())["best_value"] == pytest.approx(
        ok["told"]
    )
    assert "| failed |" in (tmp_path / "grid" / "report.md").read_text()


def test_joblib_runs_two_jobs_at_once_in_one_sweep_directory(tmp_path):
    proc = rlkit("train", "-m", *FAST, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0,1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (sweep,) = (
        tmp_path / "runs" / "sft_gsm8k_smoke"
    ).iterdir()  # one directory, though each worker resolves the config again
    a, b = result(sweep / "0"), result(sweep / "1")
    assert a["status"] == b["status"] == "completed"
    assert [yaml.safe_load((sweep / j / "config.yaml").read_text())["seed"] for j in "01"] == [0, 1]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout
    assert a["started"] < b["time"] and b["started"] < a["time"], (a, b)  # they overlapped
    assert (sweep / "report.md").exists()


def test_submitit_local_jobs_share_a_wandb_group(tmp_path):
    proc = rlkit(
        "train",
        "-m",
        *FAST,
        "hydra/launcher=submitit_local",
        "logger=wandb",
        "seed=0,1",
        "run_dir=sub",
        cwd=tmp_path,
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert proc.returncode == 0, proc.stderr
    sweep = tmp_path / "sub"
    assert (sweep / ".submitit").is_dir()  # submitit's own job folders, beside the run directories
    groups = set()
    for job in ("0", "1"):
        assert result(sweep / job)["status"] == "completed"
        (offline,) = (sweep / job / "wandb").glob("offline-run-*/run-*.wandb")
        groups.add(_wandb_run_group(offline))
    assert groups == {f"{tmp_path.name}/sub"}
    assert "| 0 " in (sweep / "report.md").read_text() and "| 1 " in (sweep / "report.md").read_text()


def _wandb_run_group(path):
    """The run group recorded in an offline ``.wandb`` file (a LevelDB-format log of protobuf
    records: 7-byte file header, 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, pending = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += block - pos % block
            continue
        pending += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "run":
                return record.run.run_group
    raise AssertionError(f"no run record in {path}")


def test_a_killed_sweep_job_is_reported_and_resumes_into_its_own_directory(tmp_path, capsys):
    args = [
        "train",
        "-m",
        "recipe=sft_gsm8k_smoke",
        "train.generate.examples=0",
        "data.eval.limit=2",
        "train.steps=40",
        "train.eval_every=0",
        "train.checkpoint_every=4",
        "seed=0,1",
        "run_dir=sw",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlkit", *args],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    job = tmp_path / "sw" / "1"
    deadline = time.time() + 180
    try:
        while time.time() < deadline and not (
            (job / "checkpoints.jsonl").exists() and (job / "checkpoints.jsonl").read_text().count("\n") >= 1
        ):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (job / "result.json").exists() and (job / ".lock").read_text().startswith(
        f"pid {proc.pid} on "
    )  # what it left
    assert result(tmp_path / "sw" / "0")["status"] == "completed"
    assert cli.main(["sweep", "report", str(tmp_path / "sw")]) == 0
    rows = {r["job"]: r for r in csv.DictReader((tmp_path / "sw" / "report.csv").open())}
    assert rows["0"]["status"] == "completed" and rows["1"]["status"] == "killed"
    assert 0 < int(rows["1"]["steps"]) < 40
    # its objective so far is the evaluation before training (eval_every=0): said, not passed off as a result
    killed_row = next(x for x in (tmp_path / "sw" / "report.md").read_text().splitlines() if x.startswith("| 1 |"))
    assert "(step 0, unfinished)" in killed_row, killed_row
    checkpoint = json.loads((job / "checkpoints.jsonl").read_text().splitlines()[-1])["step"]

    resumed = rlkit("train", f"resume={job}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {job} from step {checkpoint}" in resumed.stderr
    steps = [json.loads(x)["step"] for x in (job / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(41))  # nothing lost, nothing twice
    assert sorted(p.name for p in (tmp_path / "sw").iterdir() if p.is_dir()) == ["0", "1"]  # into its own directory
    assert result(job)["status"] == "completed" and "seed=1" in result(job)["overrides"]
    capsys.readouterr()
    assert cli.main(["sweep", "report", str(tmp_path / "sw")]) == 0
    assert capsys.readouterr().out.count("| completed |") == 2
