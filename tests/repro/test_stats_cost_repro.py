"""Statistics by hand, the token estimate against a real run, and `rlkit repro` end to end."""

import json
import shutil
import math
import sys

import pytest

from rlkit.stats import summarize, t_critical_95
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def test_summary_by_hand():
    s = summarize([0.5, 0.7, 0.6])
    # mean 0.6; sample std sqrt(((-.1)^2 + .1^2 + 0)/2) = 0.1; half-width 4.303 * 0.1 / sqrt(3)
    assert s.mean == pytest.approx(0.6)
    assert s.std == pytest.approx(0.1)
    assert s.ci95_low == pytest.approx(0.6 - 4.303 * 0.1 / math.sqrt(3))
    assert s.ci95_high == pytest.approx(0.6 + 4.303 * 0.1 / math.sqrt(3))
    two = summarize([1.0, 3.0])  # std sqrt(2), half = 12.706 * sqrt(2)/sqrt(2)
    assert (two.ci95_low, two.ci95_high) == pytest.approx((2.0 - 12.706, 2.0 + 12.706))
    assert summarize([4.0]).ci95_low is None
    assert t_critical_95(10) == 2.228
    with pytest.raises(ValueError):
        summarize([])


def rlkit(*args, cwd):
    return warm_rlkit.run(args, cwd=cwd, timeout=400)


def test_token_estimate_matches_a_run(tmp_path):
    from rlkit.cli import compose
    from rlkit.cost import actual, estimate

    run = tmp_path / "run"
    out = rlkit("train", "recipe=arithmetic_grpo_smoke", f"run_dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    est = estimate(compose(["recipe=arithmetic_grpo_smoke"]))
    got = actual(run)
    # stated tolerance: prefill within 2% (prompt lengths vary by a token); sampled and trained are
    # upper bounds that the tiny model (which almost never emits end-of-turn) nearly reaches: within 5%
    assert got["prefill"] == pytest.approx(est["prefill"], rel=0.02)
    assert got["sampled"] <= est["sampled"] and got["sampled"] == pytest.approx(est["sampled"], rel=0.05)
    assert got["trained"] <= est["trained"] and got["trained"] == pytest.approx(est["trained"], rel=0.05)
    printed = rlkit("cost", f"run={run}", "prefill_price=0.1", "sampled_price=0.4", "train_price=1", "gpu_hour_price=3",
                    "train_tok_s=1000", "sample_tok_s=100", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    assert "estimate" in printed.stdout and "actual" in printed.stdout and "Estimates, not invoices" in printed.stdout
    bad = rlkit("cost", "recipe=arithmetic_grpo_smoke", "train_price=cheap", cwd=tmp_path)
    assert bad.returncode == 2 and "train_price='cheap' is not a number" in bad.stderr


def test_repro_two_seeds_report(tmp_path):
    out_dir = tmp_path / "report"
    out = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=2", "jobs=2", f"out={out_dir}", "train.steps=2", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # jobs=2: both seeds' first runs start before any run ends; each seed's arms in order
    first_done = out.stderr.index("] rl seed")
    assert out.stderr.index("rl seed 0: starting") < first_done and out.stderr.index("rl seed 1: starting") < first_done
    for s in (0, 1):
        assert out.stderr.index(f"] rl seed {s} done") < out.stderr.index(f"sft seed {s}: starting")
    bad = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=2", "jobs=0", f"out={tmp_path / 'unused'}", cwd=tmp_path)
    assert bad.returncode == 2 and "jobs='0': expected a positive integer" in bad.stderr and not (tmp_path / "unused").exists()
    for name in ("report.md", "report.json", "report.png"):
        assert (out_dir / name).exists(), name
    report = json.loads((out_dir / "report.json").read_text())
    assert set(report["arms"]) == {"rl", "sft"}
    assert report["machine"]["cpus"] and report["machine"]["torch"]
    if sys.platform.startswith("linux"):  # the rlkit command preloads mimalloc (rlkit.malloc_preload)
        assert report["machine"]["allocator"] == "mimalloc"
    for arm in report["arms"].values():
        assert [r["seed"] for r in arm["runs"]] == [0, 1]
        summary = arm["summary"]
        for key in ("eval/greedy_accuracy", "eval/pass@2"):
            for part in ("before", "after", "improvement"):
                assert set(summary[key][part]) == {"n", "mean", "std", "ci95_low", "ci95_high"}
        assert summary["wall_s"]["mean"] > 0
        assert all(r["tokens"]["tokens/trained"] > 0 for r in arm["runs"])
    md = (out_dir / "report.md").read_text()
    assert "greedy_accuracy" in md and "95% CI" in md and "Machine:" in md
    again = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=2", f"out={out_dir}", cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr and "train.steps=2" not in again.stderr
    assert "different request (overrides differ)" in again.stderr and not (out_dir / "rl" / "seed_2").exists()

    # a repro killed twice over: during sft seed 1 (its run directory gone here, as if never started)
    # and after rl seed 1's final checkpoint, before its final evaluation; the same command continues it
    shutil.rmtree(out_dir / "sft" / "seed_1")
    (out_dir / "sft" / "seed_1.wall_s").unlink()
    (out_dir / "rl" / "seed_1.wall_s").unlink()
    metrics = out_dir / "rl" / "seed_1" / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:-1]))
    for name in ("report.md", "report.json", "report.png"):
        (out_dir / name).unlink()
    resumed = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=2", "jobs=2", f"out={out_dir}", "train.steps=2", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("finished earlier") == 2 and "rl seed 1" in resumed.stderr
    assert f"run_dir={out_dir / 'rl' / 'seed_1'}   # resumes" in resumed.stderr
    again = json.loads((out_dir / "report.json").read_text())
    for arm in ("rl", "sft"):
        assert [r["after"] for r in again["arms"][arm]["runs"]] == [r["after"] for r in report["arms"][arm]["runs"]]
    rl1 = again["arms"]["rl"]["runs"][1]
    assert rl1["resumed"] and 0 < rl1["wall_s"] and not again["arms"]["sft"]["runs"][1]["resumed"]
    assert "* resumed after the repro was stopped" in (out_dir / "report.md").read_text()

    # more seeds extend it: seeds 0-1 are read back, only seed 2 runs; fewer seeds are refused
    extended = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=3", f"out={out_dir}", "train.steps=2", cwd=tmp_path)
    assert extended.returncode == 0, extended.stderr
    assert "from 2 to 3 seeds" in extended.stderr and extended.stderr.count("finished earlier") == 4
    assert "rl seed 2: starting" in extended.stderr and "sft seed 2: starting" in extended.stderr
    three = json.loads((out_dir / "report.json").read_text())
    assert [r["seed"] for r in three["arms"]["rl"]["runs"]] == [0, 1, 2]
    assert three["arms"]["rl"]["runs"][:2] == again["arms"]["rl"]["runs"]
    assert three["arms"]["rl"]["summary"]["eval/greedy_accuracy"]["after"]["n"] == 3
    assert json.loads((out_dir / "repro.json").read_text())["seeds"] == 3
    fewer = rlkit("repro", "recipe=arithmetic_grpo_smoke", "seeds=2", f"out={out_dir}", "train.steps=2", cwd=tmp_path)
    assert fewer.returncode == 2 and "(seeds differ (fewer seeds than it holds))" in fewer.stderr
    assert json.loads((out_dir / "report.json").read_text()) == three  # nothing rewritten


def test_finished_and_logged_seconds_read_a_run_directory(tmp_path):
    """A run is finished once its final evaluation (step == train.steps) is logged; a step line's
    time/step already includes that step's evaluation, the final line has only time/eval."""
    from rlkit.repro import finished, logged_seconds

    (tmp_path / "config.yaml").write_text("train:\n  steps: 2\n")
    lines = [{"step": 0, "eval/greedy_accuracy": 0.1, "time/eval": 7.0, "time/step": 10.0}, {"step": 1, "time/step": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert not finished(tmp_path) and logged_seconds(tmp_path) == 13.0
    lines.append({"step": 2, "eval/greedy_accuracy": 0.5, "time/eval": 5.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert finished(tmp_path) and logged_seconds(tmp_path) == 18.0
