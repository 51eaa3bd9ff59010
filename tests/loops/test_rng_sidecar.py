"""A checkpoint's RNG states live in rng/step_XXXXXX.json beside checkpoints.jsonl (short lines);
a resumed run gets its loop_state whole again and continues the same random streams; a run written
before (RNG states inline) still resumes; a rewind drops the RNG files of dropped checkpoints."""

import json
import random
from types import SimpleNamespace

import numpy as np
import torch

from rlkit.composition import compose
from rlkit.rng import capture_rng, restore_rng
from rlkit.runs import CHECKPOINTS, Run


class FakeTrainer:
    def save_state(self, name):
        fut = SimpleNamespace(result=lambda: SimpleNamespace(model_package_arn=f"arn:aws:sagemaker:fake/{name.split()[-1]}"))
        return fut


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_states_beside_the_checkpoint_and_an_exact_resume(tmp_path):
    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run'}"])
    run = Run.open(cfg, tmp_path / "run")
    run.materialize()
    state = {"data": {"position": 7}, "curriculum": {"pass_rate": [0.5], "rng": [3, list(range(625)), None]}, "rng": capture_rng()}
    expected = draws()
    run.save_checkpoint(1, FakeTrainer(), state)
    run.save_checkpoint(2, FakeTrainer(), {**state, "data": {"position": 9}})
    run.close()
    lines = (tmp_path / "run" / CHECKPOINTS).read_text().splitlines()
    assert all(len(line) < 400 for line in lines), [len(line) for line in lines]  # ~11 KB each when inline
    first = json.loads(lines[0])
    assert first["rng_file"] == "rng/step_000001.json" and "rng" not in first["loop_state"]
    assert "rng" not in first["loop_state"]["curriculum"] and first["loop_state"]["curriculum"]["pass_rate"] == [0.5]

    (tmp_path / "run" / CHECKPOINTS).write_text(lines[0] + "\n")  # as if killed before step 2's line was the last
    resumed = Run.open(cfg, tmp_path / "run")
    resumed.materialize()
    record = resumed.checkpoint_record()
    assert record["step"] == 1 and record["loop_state"] == json.loads(json.dumps(state))
    restore_rng(record["loop_state"]["rng"])
    assert draws() == expected
    assert sorted(p.name for p in (tmp_path / "run" / "rng").iterdir()) == ["step_000001.json"]  # step 2's went with its line
    resumed.close()


def test_a_run_with_inline_rng_state_still_resumes(tmp_path):
    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run'}"])
    run = Run.open(cfg, tmp_path / "run")
    run.materialize()
    run.close()
    state = {"data": {"position": 3}, "rng": capture_rng()}
    expected = draws()
    old = {"step": 1, "checkpoint": "arn:aws:sagemaker:fake/1", "time": 0.0, "loop_state": state}
    (tmp_path / "run" / CHECKPOINTS).write_text(json.dumps(old) + "\n")
    resumed = Run.open(cfg, tmp_path / "run")
    resumed.materialize()
    record = resumed.checkpoint_record()
    assert record["loop_state"]["data"] == {"position": 3}
    restore_rng(record["loop_state"]["rng"])
    assert draws() == expected
    resumed.close()
