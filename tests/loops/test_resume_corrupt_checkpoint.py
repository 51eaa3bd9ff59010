"""Resuming a run whose newest checkpoint is corrupt says so in one line and falls back to the
newest checkpoint that verifies; the recomputed steps equal the original run's."""

import json
import logging
import math
from pathlib import Path

from rlkit import cli
from rlkit.checkpoint_verify import restorable_records

ARGS = [
    "recipe=sft_gsm8k_smoke",
    "backend.num_threads=null",  # don't pin this pytest process's torch threads
    "logger.console=false",
    "data.train.limit=48",
    "train.steps=6",
    "train.checkpoint_every=2",
    "train.eval_every=3",
    "train.generate.examples=0",
]


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def checkpoint_dir(record):
    return Path(record["checkpoint"][len("local://") :])


def deterministic(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in metrics]


def test_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path, caplog):
    run = tmp_path / "run"
    cli.execute(cli.compose(ARGS), run)
    want = deterministic(lines(run / "metrics.jsonl"))
    records = lines(run / "checkpoints.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6]
    adapter = checkpoint_dir(records[-1]) / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-3000:-100] = bytes((b + 0x5A) % 256 for b in data[-3000:-100])  # 2.9 kB overwritten near the end
    adapter.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="rlkit"):
        cli.execute(cli.compose(ARGS), run)  # rerunning into the run directory resumes it
    notes = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
    assert len(notes) == 1, notes
    note = notes[0]
    assert "\n" not in note
    assert "checkpoint of step 6" in note and "adapter_model.safetensors does not match its SHA-256" in note
    assert f"resuming from the checkpoint of step 4 ({records[1]['checkpoint']})" in note
    assert note.endswith("2 step(s) will be recomputed")
    got = deterministic(lines(run / "metrics.jsonl"))
    assert [m["step"] for m in got] == [m["step"] for m in want]
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert math.isclose(g[k], w[k], rel_tol=1e-6, abs_tol=1e-9) if isinstance(g[k], float) else g[k] == w[k], k
    after = lines(run / "checkpoints.jsonl")
    assert [r["step"] for r in after] == [2, 4, 6] and after[-1]["checkpoint"] != records[-1]["checkpoint"]


def test_no_checkpoint_verifies_means_starting_over(tmp_path):
    records = [{"step": 2, "checkpoint": f"local://{tmp_path}/a"}, {"step": 4, "checkpoint": f"local://{tmp_path}/b"}]
    said = []
    assert restorable_records(records, said.append) == []
    assert len(said) == 1 and said[0].startswith("checkpoints of steps 2, 4 cannot be restored (no checkpoint at")
    assert said[0].endswith("no earlier checkpoint verifies: starting over from step 0: 4 step(s) will be recomputed")
    remote = [{"step": 2, "checkpoint": "arn:aws:sagemaker:us-west-2:123456789012:model-package/x/1"}]
    assert restorable_records(remote, said.append) == remote and len(said) == 1  # cannot be checked here: trusted
