"""A DPO or on-policy distillation run that dies after a checkpoint resumes from its directory and
writes the same metrics as a run that never stopped (tiny model, in process)."""

import json

import pytest

from rlkit import cli
from rlkit.runs import Run

# max_batch_rows=1: each sampling request decodes alone, so the batch a request lands in (which
# depends on thread timing) cannot change the last digits of its logits and flip a sampled token
COMMON = ["logger.console=false", "backend.num_threads=null", "backend.max_batch_rows=1", "train.steps=4", "train.checkpoint_every=1", "train.eval_every=2"]
CASES = {
    "dpo": ["recipe=dpo_gsm8k_smoke", "data.train.limit=4", "data.eval.limit=2", "train.generate.examples=0"],
    "onpolicy": ["recipe=prompt_distillation_smoke"],
}


class Crash(Exception):
    pass


def metrics_of(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # time/* are wall clock; */calls count this process's reference/teacher requests (a resumed
    # process starts its cache afresh)
    return [{k: v for k, v in r.items() if not k.startswith("time/") and not k.endswith("/calls")} for r in rows]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_crashed_run_resumes_and_matches_an_uninterrupted_one(case, tmp_path, monkeypatch):
    overrides = CASES[case] + COMMON
    cli.execute(cli.compose(overrides), tmp_path / "straight")

    original = Run.log

    def crash_at_step_2(self, step, metrics):
        if step == 2:
            raise Crash("killed")
        return original(self, step, metrics)

    monkeypatch.setattr(Run, "log", crash_at_step_2)
    with pytest.raises(Crash):
        cli.execute(cli.compose(overrides), tmp_path / "crashed")
    monkeypatch.setattr(Run, "log", original)
    assert [json.loads(x)["step"] for x in (tmp_path / "crashed" / "checkpoints.jsonl").read_text().splitlines()] == [1, 2]
    cli.execute(cli.compose(overrides), tmp_path / "crashed")  # rerun into the same directory: resumes at step 2

    straight, resumed = metrics_of(tmp_path / "straight"), metrics_of(tmp_path / "crashed")
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [0, 1, 2, 3, 4]
    # the same tokens are sampled and trained on, with the same weights: every metric agrees
    for a, b in zip(straight, resumed):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (a["step"], key)
