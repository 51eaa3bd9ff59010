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


def test_the_scaffold_owns_the_cadence_the_rng_seed_and_the_finish(tmp_path):
    """One eval/checkpoint rule for every loop; the RNGs are seeded by the scaffold, not by the
    Run; logging never starts the console by itself; finish records that the run finished in
    result.json even when the loop evaluates nothing."""
    import random

    from rlkit.config import LoopConfig

    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run'}", "seed=5", "logger.console=false"])
    run = Run.open(cfg, tmp_path / "run")
    random.seed(123)
    run.materialize()  # takes the directory; touches no RNG
    assert random.random() == random.Random(123).random()
    run.log(0, {"train/x": 0.0})  # before start(): metrics.jsonl only, no sinks opened behind the loop's back
    assert not run.started
    run.close()

    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run2'}", "seed=5", "logger.console=false"])
    run = Run.open(cfg, tmp_path / "run2")
    with LoopSession(run) as session:
        assert random.random() == random.Random(5).random()  # entering seeded the global RNGs from cfg.seed
        session.trainer = LineCheckingTrainer(tmp_path / "run2" / METRICS)
        with pytest.raises(RuntimeError, match="call begin"):
            session.eval_due(0)
        steps = session.begin(LoopConfig(eval_every=2, checkpoint_every=3), 5)
        assert list(steps) == [0, 1, 2, 3, 4] and run.started
        assert [session.eval_due(d) for d in range(6)] == [True, False, True, False, True, True]
        assert [session.checkpoint_due(d) for d in range(1, 6)] == [False, False, True, False, True]
        for step in steps:
            session.end_step(step, {"train/x": float(step)}, session.checkpoint(step + 1, {"position": step}))
        last = session.finish(lambda: {}, plot_keys=("train/x",))  # a recipe with evaluation off
    assert last["train/x"] == 4.0 and [r["step"] for r in run.metrics()] == [0, 1, 2, 3, 4]  # no empty final line
    assert [json.loads(x)["step"] for x in (tmp_path / "run2" / CHECKPOINTS).read_text().splitlines()] == [3, 5]
    result = json.loads((tmp_path / "run2" / "result.json").read_text())
    assert result["status"] == "completed" and result["steps"] == 5
    assert (tmp_path / "run2" / "metrics.png").exists()
