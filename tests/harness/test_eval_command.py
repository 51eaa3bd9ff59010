"""``rlkit eval`` end to end, offline: GSM8K and MBPP (rlkit's copies of the data, MBPP's programs in
the sandbox) on the tiny model and on a training run's newest checkpoint, writing lm-eval's results
JSON and per-sample logs; and each bad input refused in one line with exit code 2, before any model
loads (subprocesses, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # whole evaluations and subprocesses

FAST = ["limit=2", "gen_kwargs=max_gen_toks=24", "precision=fp32", "bootstrap_iters=0"]  # a random model never stops by itself


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run directory as ``rlkit train`` leaves it: config.yaml and checkpoints.jsonl naming a
    sampler checkpoint of the tiny model (step 3), and a checkpoint of it, by directory."""
    import rlkit

    root = tmp_path_factory.mktemp("run")
    service = rlkit.connect("local", precision="fp32", checkpoint_dir=root / "checkpoints")
    try:
        trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
        checkpoint = trainer.save_weights_for_sampler(name="step-3").result().model_package_arn
        trainer.stop()
    finally:
        service.close()
    run = root / "tiny_run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: test\nmodel:\n  name: tiny\n")
    (run / "checkpoints.jsonl").write_text(json.dumps({"step": 3, "checkpoint": checkpoint}) + "\n")
    return run, Path(checkpoint[len("local://"):])


def results_of(path: Path) -> dict:
    return json.loads(path.read_text())


def test_base_model_gsm8k_and_mbpp_offline(tmp_path, offline, capsys, monkeypatch):
    from rlkit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "model=tiny", "tasks=gsm8k,mbpp", *FAST]) == 0
    out = capsys.readouterr().out
    assert "|gsm8k|" in out and "|mbpp |" in out and "exact_match" in out and "pass_at_1" in out  # lm-eval's table
    written = list((tmp_path / "rlkit-eval" / "tiny").glob("results_*.json"))
    assert len(written) == 1 and f"results: {written[0]}" in out
    results = results_of(written[0])
    assert set(results["results"]) == {"gsm8k", "mbpp"}
    assert results["configs"]["gsm8k"]["dataset_path"] == "json"  # rlkit's copy, not the hub's
    assert results["n-samples"]["mbpp"] == {"original": 500, "effective": 2}  # the hub's test split: 500 items
    samples = [json.loads(line) for line in next((tmp_path / "rlkit-eval" / "tiny").glob("samples_mbpp_*.jsonl")).read_text().splitlines()]
    assert [s["doc"]["task_id"] for s in samples] == [11, 12]


def test_run_directory_newest_checkpoint(tiny_run, offline, capsys):
    from rlkit.cli import main

    run, _ = tiny_run
    assert main(["eval", f"run={run}", "tasks=gsm8k", *FAST]) == 0
    out = capsys.readouterr().out
    assert "step 3" in out
    written = list((run / "eval" / "tiny_run-step3").glob("results_*.json"))
    assert len(written) == 1
    config = results_of(written[0])["config"]
    assert config["rlkit_step"] == 3 and config["rlkit_checkpoint"].startswith("local://")


def run_eval(args, env=None, wrapper=None):
    code = wrapper or "import sys; from rlkit.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, "eval", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})})


NO_SANDBOX = ("import sys\n"
              "from rlkit.sandbox import selfcheck, SandboxUnavailableError\n"
              "selfcheck.ensure_available = lambda *a, **k: (_ for _ in ()).throw(SandboxUnavailableError("
              "'sandbox unavailable: cannot create namespaces here'))\n"
              "import rlkit.sandbox; rlkit.sandbox.ensure_available = selfcheck.ensure_available\n"
              "from rlkit.cli import main; sys.exit(main(sys.argv[1:]))")


def test_bad_input_one_line_exit_2(tiny_run):
    _, checkpoint_dir = tiny_run
    cases = {
        "unknown task": (run_eval(["model=tiny", "tasks=gsm8k,gsm8kk"]), "did you mean: gsm8k"),
        "another base model": (run_eval(["model=smollm2-135m-instruct", f"checkpoint={checkpoint_dir}", "tasks=gsm8k"]),
                               "was trained on base model 'tiny'"),
        "data not offline": (run_eval(["model=tiny", "tasks=arc_easy"]), "not reachable"),
        "no sandbox": (run_eval(["model=tiny", "tasks=mbpp"], wrapper=NO_SANDBOX), "sandbox unavailable"),
        "bad limit": (run_eval(["model=tiny", "tasks=gsm8k", "limit=-1"]), "limit=-1"),
        "unknown option": (run_eval(["model=tiny", "tasks=gsm8k", "out=x"]),
                           "out='x': not an option of rlkit eval, lm-eval or the local engine (did you mean output=?)"),
    }
    for name, (proc, expected) in cases.items():
        out, err = proc.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2, (name, err)
        assert len(lines) == 1 and lines[0].startswith("rlkit: error: ") and expected in lines[0], (name, err)
        assert "Traceback" not in err and "rlkit lm-eval model" not in err + out, name  # refused before any model loaded
