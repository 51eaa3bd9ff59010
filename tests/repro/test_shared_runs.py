"""Runs on threads of one process sharing one local engine (rlkit.thread_runs): ``rlkit repro
jobs=shared`` and ``hydra/launcher=rlkit_shared`` write, per run, what ``rlkit train`` writes for
that run alone; one service serves them all; what cannot share is one line, exit 2."""

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

import rlkit
from rlkit.cli import main

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

#: a run sharing the engine against the run alone: its rows are decoded, and its forward_backward
#: passes run (fuse_runs), in batches with another run's (other shapes: fp32 sums in another order)
TOLERANCE = {"rel": 1e-4, "abs": 1e-6}
#: adapters after Adam steps, per tensor: |shared - alone| <= this x |alone|. Adam's first step is
#: lr * g / (|g| + eps), so an element whose gradient is near eps moves with the gradient's rounding
#: (measured 1e-6 to 1.2e-4); another seed's adapter, or another run's gradient, is ~1 away
ADAPTER_RTOL = 1e-2
RECIPE = ["recipe=arithmetic_grpo_signal_smoke", "train.steps=1", "train.eval.pass_k=2"]  # gradient, and every repro metric


def _metrics(run: Path):
    """metrics.jsonl without the wall-clock keys (time/*)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in m.items() if not k.startswith("time/")} for m in lines]


def assert_same_run(shared: Path, alone: Path, *, result_differs=("overrides", "started", "time")):
    assert sorted(p.name for p in shared.iterdir()) == sorted(p.name for p in alone.iterdir())
    got, want = _metrics(shared), _metrics(alone)
    assert [sorted(m) for m in got] == [sorted(m) for m in want]
    for g, w in zip(got, want):  # batched with other runs' rows, fp32 sums round differently: TOLERANCE
        assert g == pytest.approx(w, **TOLERANCE)
    config = [yaml.safe_load((d / "config.yaml").read_text()) for d in (shared, alone)]
    for c in config:
        c.pop("run_dir")
    assert config[0] == config[1]
    for f in sorted((alone / "rng").iterdir()):  # the RNG state each checkpoint carries: the run's own
        assert (shared / "rng" / f.name).read_text() == f.read_text()
    adapters = [sorted(d.glob("checkpoints/*/state-*/adapter_model.safetensors")) for d in (shared, alone)]
    assert len(adapters[0]) == len(adapters[1]) >= 1
    for a, b in zip(*adapters):
        assert a.is_relative_to(shared)  # under the run's own checkpoints/, not another run's
        ta, tb = load_file(a), load_file(b)
        assert ta.keys() == tb.keys()
        for k in ta:  # lora_B starts at zero: its norm is what training wrote; the difference is rounding's
            assert float((ta[k] - tb[k]).norm()) <= ADAPTER_RTOL * float(tb[k].norm()), k
    result = [json.loads((d / "result.json").read_text()) for d in (shared, alone)]
    assert result[0].keys() == result[1].keys() and result[0]["status"] == "completed"
    assert {k: v for k, v in result[0].items() if k not in result_differs} == {
        k: v for k, v in result[1].items() if k not in result_differs}


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """Seeds 0 and 1, each an ``rlkit train`` run of its own (one after the other)."""
    root = tmp_path_factory.mktemp("alone")
    for s in (0, 1):
        assert main(["train", *RECIPE, f"seed={s}", f"run_dir={root / f'seed_{s}'}"]) == 0
    return root


@pytest.fixture
def connects(monkeypatch):
    """Every service ``rlkit.connect`` makes."""
    made = []
    real = rlkit.connect

    def counting(name, **options):
        made.append(name)
        return real(name, **options)

    monkeypatch.setattr(rlkit, "connect", counting)
    return made


def test_repro_jobs_shared_runs_each_seed_as_it_runs_alone(alone, tmp_path, connects, capsys):
    from rlkit.repro import repro

    report = repro("arithmetic_grpo_signal_smoke", 2, tmp_path / "out", RECIPE[1:], sft=False, jobs="shared",
                   log=lambda m: None)
    assert connects == ["local"]  # one service (one base model in memory, one sampler) for both seeds
    assert [r["seed"] for r in report["arms"]["rl"]["runs"]] == [0, 1]
    for s in (0, 1):
        assert_same_run(tmp_path / "out" / "rl" / f"seed_{s}", alone / f"seed_{s}")
    assert capsys.readouterr().out == ""  # the runs' console lines are not the repro's output


def test_shared_launcher_runs_a_sweep_in_one_process_as_each_job_alone(alone, tmp_path, connects):
    sweep = tmp_path / "sweep"
    assert main(["train", "-m", *RECIPE, "seed=0,1", "hydra/launcher=rlkit_shared", f"run_dir={sweep}"]) == 0
    assert connects == ["local"]  # both jobs on one service in this process
    for s in (0, 1):  # a job of a sweep records its number
        assert json.loads((sweep / str(s) / "result.json").read_text())["job"] == s
        assert_same_run(sweep / str(s), alone / f"seed_{s}", result_differs=("job", "overrides", "started", "time"))
    assert (sweep / "report.md").is_file()


def test_what_cannot_share_the_engine_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "unused"
    assert main(["repro", "recipe=arithmetic_grpo_smoke", "seeds=2", "jobs=shared", f"out={out}", "backend.nproc=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlkit: error: jobs=shared: backend.nproc=2 runs each run on several processes; use backend.nproc=1"]
    assert not out.exists()
    assert main(["repro", "recipe=arithmetic_grpo_smoke", "seeds=2", "jobs=some", f"out={out}"]) == 2
    assert "jobs='some': expected a positive integer (seeds run at once) or shared" in capsys.readouterr().err
    sweep = tmp_path / "sweep"
    assert main(["train", "-m", "recipe=arithmetic_grpo_smoke", "seed=0,1", "hydra/launcher=rlkit_shared",
                 "logger=wandb", f"run_dir={sweep}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rlkit: error: ") and "hydra/launcher=rlkit_shared: logger=wandb keeps one W&B run per process" in err[-1]
    assert not sweep.exists()
