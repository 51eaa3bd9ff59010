"""`python -m rlkit train ...` end to end on the tiny model (subprocesses, CPU, no network): a
2-step SFT run leaves every run-directory file; a 2x2 sweep; bad input gives one line on stderr
and exit code 2, with no traceback, and never overwrites an existing run."""

import json
import os

import pytest
import yaml
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

TINY = [
    "recipe=sft_gsm8k",
    "model=tiny",
    "backend.precision=fp32",
    "backend.num_threads=1",
    "data.train.limit=32",
    "data.eval.limit=4",
    "train.steps=2",
    "train.batch_tokens=1024",
    "train.warmup_steps=0",
    "train.checkpoint_every=1",
    "train.generate.examples=2",
    "train.generate.max_tokens=4",
]


def rlkit(*args, cwd, env=None, timeout=120):
    return warm_rlkit.run(args, cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


def assert_user_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlkit: error: ")
    for fragment in fragments:
        assert fragment in last, last
    return last


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    proc = rlkit("train", *TINY, "run_dir=run", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run", proc


def test_two_step_sft_run_writes_the_run_directory(two_step_run):
    run, proc = two_step_run
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["recipe"] == "sft_gsm8k" and config["loop"] == "sft"
    assert config["model"]["base_model"] == "tiny" and config["run_dir"] == str(run.resolve())
    assert config["train"]["lr_schedule"] == "cosine"  # resolved, enums as text
    assert yaml.safe_load((run / "overrides.yaml").read_text())[:2] == ["recipe=sft_gsm8k", "model=tiny"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    for key in ("train/nll", "train/loss", "train/tokens", "train/lr", "train/grad_norm", "time/step_s", "time/tokens_per_s"):
        assert key in lines[0] and key in lines[1]
    assert "eval/nll" in lines[0] and "eval/nll" in lines[2] and "eval/accuracy" in lines[2]
    checkpoints = [json.loads(x) for x in (run / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints] == [1, 2]
    assert checkpoints[-1]["checkpoint"].startswith("local://" + str(run.resolve() / "checkpoints"))
    assert checkpoints[-1]["loop_state"]["data"]["position"] > 0
    assert sorted(p.name for p in (run / "transcripts").iterdir()) == ["step_000000.jsonl", "step_000002.jsonl"]
    sample = json.loads((run / "transcripts" / "step_000002.jsonl").read_text().splitlines()[0])
    assert {"prompt", "completion", "reward", "reference"} <= set(sample)
    assert (run / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert "step 1 (2/2)" in proc.stdout


def test_rerunning_a_finished_run_resumes_it_and_loses_nothing(two_step_run):
    run, _ = two_step_run
    before = (run / "checkpoints.jsonl").read_text()
    metrics_before = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    proc = rlkit("train", *TINY, f"run_dir={run}", cwd=run.parent)
    assert proc.returncode == 0, proc.stderr
    assert "resuming" in proc.stderr and "from step 2" in proc.stderr
    assert (run / "checkpoints.jsonl").read_text() == before
    after = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in after] == [0, 1, 2]
    assert after[:2] == metrics_before[:2]
    assert after[2]["eval/nll"] == metrics_before[2]["eval/nll"]


def test_two_by_two_sweep(tmp_path):
    proc = rlkit(
        "train", "-m", "recipe=sft_gsm8k_smoke", "train.learning_rate=1e-3,3e-3", "seed=0,1",
        "train.steps=2", "train.generate.examples=0", "data.eval.limit=2", "run_dir=sweep",
        cwd=tmp_path, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = sorted((tmp_path / "sweep").iterdir(), key=lambda p: p.name)
    jobs = [j for j in jobs if j.is_dir()]
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    seen = set()
    for job in jobs:
        config = yaml.safe_load((job / "config.yaml").read_text())
        seen.add((config["train"]["learning_rate"], config["seed"]))
        assert (job / "metrics.jsonl").read_text().count("\n") == 3
        assert (job / "metrics.png").exists()
    assert seen == {(1e-3, 0), (1e-3, 1), (3e-3, 0), (3e-3, 1)}


# -- bad input: one line on stderr, exit code 2, no traceback ---------------------------------------


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["recipe=no_such_recipe"], ["unknown recipe 'no_such_recipe'", "sft_gsm8k"]),
        (["recipe=sft_gsm8k_smoke", "train.lerning_rate=0.1"], ["unknown config key 'train.lerning_rate'", "SFTConfig"]),
        (["recipe=sft_gsm8k_smoke", "train.steps=many"], ["config key 'train.steps'", "could not be converted to Integer"]),
        (["recipe=sft_gsm8k_smoke", "data.train.path=missing/train.jsonl"], ["data file 'missing/train.jsonl' not found"]),
        (["-m", "recipe=sft_gsm8k_smoke", "seed=0,1", "train.stepz=1"], ["unknown config key 'train.stepz'"]),
    ],
)
def test_config_errors(tmp_path, args, fragments):
    proc = rlkit("train", *args, cwd=tmp_path)
    assert_user_error(proc, *fragments)
    assert not (tmp_path / "runs").exists()  # refused before any run directory was made


def test_malformed_jsonl_row(tmp_path):
    good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"})
    (tmp_path / "bad.jsonl").write_text(f"{good}\n{good}\n{{\"question\": \"3+4?\", \"answer\": 7}}\n")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", "data.train.path=bad.jsonl", "run_dir=r", cwd=tmp_path)
    assert_user_error(proc, f"{tmp_path / 'bad.jsonl'}:3: field 'answer' must be str, got int")
    (tmp_path / "bad2.jsonl").write_text(f"{good}\n{{\"question\": \n")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", "data.train.path=bad2.jsonl", "run_dir=r2", cwd=tmp_path)
    assert_user_error(proc, f"{tmp_path / 'bad2.jsonl'}:2: not valid JSON")


def test_empty_dataset(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", "data.train.path=empty.jsonl", "run_dir=r", cwd=tmp_path)
    assert_user_error(proc, "data.train", "'empty.jsonl' is empty")


def test_resume_from_another_recipe(two_step_run, tmp_path):
    run, _ = two_step_run
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", f"resume={run}", cwd=tmp_path)
    assert_user_error(proc, f"run_dir {run.resolve()} holds a run of recipe 'sft_gsm8k', not 'sft_gsm8k_smoke'")
    proc = rlkit("train", f"resume={tmp_path}", cwd=tmp_path)
    assert_user_error(proc, f"resume={tmp_path}: not an rlkit run directory")


def test_init_checkpoint_starts_a_new_run_from_another_runs_weights(two_step_run, tmp_path):
    """``train.init_checkpoint``: weights from a checkpoint, fresh optimizer and step counter — the
    new run's first evaluation equals the old run's last one; every loop takes it (here SFT, then
    RL on the same tiny model); a bad id is one line, exit 2."""
    run, _ = two_step_run
    last = json.loads((run / "checkpoints.jsonl").read_text().splitlines()[-1])["checkpoint"]
    old = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    proc = rlkit("train", *TINY, "train.steps=1", "train.generate.examples=0", f"train.init_checkpoint={last}", "run_dir=sft2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    new = [json.loads(x) for x in (tmp_path / "sft2" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in new] == [0, 1]
    assert new[0]["eval/nll"] == pytest.approx(old[2]["eval/nll"], rel=1e-6)
    assert new[0]["eval/nll"] != pytest.approx(old[0]["eval/nll"], rel=1e-5)  # not the base model (2 steps move it ~1e-4)
    rl = rlkit("train", "recipe=arithmetic_grpo_smoke", "train.steps=1", f"train.init_checkpoint={last}", "run_dir=rl", cwd=tmp_path)
    assert rl.returncode == 0, rl.stderr
    assert [json.loads(x)["step"] for x in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    bad = rlkit("train", *TINY, "train.init_checkpoint=local:///nowhere", "run_dir=bad", cwd=tmp_path)
    assert_user_error(bad, "train.init_checkpoint='local:///nowhere'")


def test_existing_run_directory_is_never_overwritten(two_step_run, tmp_path):
    run, _ = two_step_run
    snapshot = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    proc = rlkit("train", *TINY, "train.learning_rate=0.5", f"run_dir={run}", cwd=tmp_path)
    assert_user_error(proc, f"run_dir {run.resolve()} holds a run with a different config", "train.learning_rate")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == snapshot
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    proc = rlkit("train", "recipe=sft_gsm8k_smoke", f"run_dir={other}", cwd=tmp_path)
    assert_user_error(proc, f"run_dir {other} already exists and is not an rlkit run")
    assert [p.name for p in other.iterdir()] == ["keep.txt"]


def test_wandb_offline_logger(tmp_path):
    proc = rlkit(
        "train", "recipe=sft_gsm8k_smoke", "logger=wandb", "train.steps=2", "train.generate.examples=0", "run_dir=r",
        cwd=tmp_path, env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"}, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    offline = list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert offline and (tmp_path / "r" / "wandb_id").exists()
