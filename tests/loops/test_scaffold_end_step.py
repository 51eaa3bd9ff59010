"""The scaffold owns the end of a step: its metrics line is written before its checkpoint is
recorded, and a Run writes nothing before it is materialized (no hidden first-call side effects)."""

import json
from types import SimpleNamespace

import pytest

from rlkit.composition import compose
from rlkit.runs import CHECKPOINTS, METRICS, Run
from rlkit.scaffold import LoopSession


class LineCheckingTrainer:
    """save_state's future records how many metrics lines existed when its result was taken."""

    def __init__(self, metrics_path):
        self.metrics_path, self.seen = metrics_path, []

    def save_state(self, name):
        def result():
            self.seen.append(len(self.metrics_path.read_text().splitlines()) if self.metrics_path.exists() else 0)
            return SimpleNamespace(model_package_arn=f"local://fake/{name.split()[-1]}")

        return SimpleNamespace(result=result)

    def stop(self):
        pass


def test_end_step_writes_the_line_then_records_the_checkpoint(tmp_path):
    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run'}"])
    run = Run.open(cfg, tmp_path / "run")
    with pytest.raises(RuntimeError, match="not taken yet"):
        run.log(0, {"x": 1.0})
    assert not (tmp_path / "run" / METRICS).exists()
    with LoopSession(run) as session:
        session.trainer = LineCheckingTrainer(tmp_path / "run" / METRICS)
        for step in range(3):
            pending = session.queue_checkpoint(step + 1, {"position": step}) if step != 1 else None
            session.end_step(step, {"train/x": float(step)}, pending)
    assert session.trainer.seen == [1, 3]  # step 0's line existed when checkpoint 1 was recorded; 0..2 for 3
    records = [json.loads(x) for x in (tmp_path / "run" / CHECKPOINTS).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 3] and records[-1]["loop_state"] == {"position": 2}
