"""rlkit repro reports lm-evaluation-harness scores (issue 54 item 5): per seed, mean and 95% CI
across seeds, beside the recipe's own metric, read from the runs' harness/* lines."""

from __future__ import annotations

import json

from rlkit.repro import _summaries, read_run, render_markdown


def write_run(path, before, after, greedy):
    path.mkdir(parents=True)
    lines = [{"step": 0, "eval/greedy_accuracy": greedy[0], "eval/pass@1_sampled": 0.1},
             {"step": 1, "harness/step": 0.0, "harness/gsm8k/exact_match/strict-match": before,
              "harness/gsm8k/exact_match/strict-match_stderr": 0.05, "harness/gsm8k/sample_len": 4.0},
             {"step": 2, "harness/step": 1.0, "harness/gsm8k/exact_match/strict-match": 0.99},  # mid-run: neither end
             {"step": 3, "eval/greedy_accuracy": greedy[1], "eval/pass@1_sampled": 0.2, "harness/step": 3.0,
              "harness/gsm8k/exact_match/strict-match": after, "harness/gsm8k/exact_match/strict-match_stderr": 0.05}]
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_harness_scores_before_and_after_with_their_ci_beside_the_recipes_metric(tmp_path):
    runs = []
    for seed, (before, after) in enumerate([(0.10, 0.20), (0.20, 0.40), (0.30, 0.30)]):
        write_run(tmp_path / f"s{seed}", before, after, (0.0, 0.5))
        run = read_run(tmp_path / f"s{seed}")
        assert run["before"]["harness/gsm8k/exact_match/strict-match"] == before  # harness/step 0, not the mid-run 0.99
        assert run["after"]["harness/gsm8k/exact_match/strict-match"] == after  # the largest harness/step
        assert not any(k.endswith(("_stderr", "sample_len")) or k == "harness/step" for k in run["after"])
        runs.append({**run, "wall_s": 1.0, "seed": seed})
    summary = _summaries(runs)["harness/gsm8k/exact_match/strict-match"]
    assert abs(summary["after"]["mean"] - 0.3) < 1e-12 and abs(summary["before"]["mean"] - 0.2) < 1e-12
    # improvements 0.1, 0.2, 0.0: mean 0.1, sd 0.1, t(0.975, 2) = 4.303 -> half-width 4.303 * 0.1 / sqrt(3)
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert abs(summary["improvement"]["ci95_high"] - (0.1 + half)) < 1e-4  # rlkit.stats tabulates t to 4 digits
    results = {"recipe": "r", "seeds": 3, "arms": {"rl": {"recipe": "r", "runs": runs, "summary": _summaries(runs)}},
               "machine": {"processor": "cpu", "cpus": 2, "platform": "linux", "python": "3.11", "torch": "2.13",
                           "torch_threads": 2, "gpu": None, "rlkit_commit": "x"}, "overrides": [], "compare": []}
    md = render_markdown(results)
    assert "| rl | harness/gsm8k/exact_match/strict-match |" in md and "| rl | greedy_accuracy |" in md
    assert "harness/gsm8k/exact_match/strict-match before → after" in md and "0.100 → 0.200" in md  # per seed


def test_a_metric_the_recipe_does_not_measure_is_left_out_not_a_crash(tmp_path):
    """train.eval.samples=0 logs eval/pass@1_sampled as nothing: the report has greedy accuracy only."""
    runs = []
    for seed, after in enumerate([0.25, 0.3125, 0.0417]):
        (tmp_path / f"s{seed}").mkdir()
        lines = [{"step": 0, "eval/greedy_accuracy": 0.0417}, {"step": 8, "eval/greedy_accuracy": after}]
        (tmp_path / f"s{seed}" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
        runs.append({**read_run(tmp_path / f"s{seed}"), "wall_s": 1.0, "seed": seed})
    assert runs[0]["after"]["eval/pass@1_sampled"] is None
    summary = _summaries(runs)
    assert "eval/pass@1_sampled" not in summary
    assert abs(summary["eval/greedy_accuracy"]["after"]["mean"] - (0.25 + 0.3125 + 0.0417) / 3) < 1e-12
    results = {"recipe": "r", "seeds": 3, "arms": {"rl": {"recipe": "r", "runs": runs, "summary": summary}},
               "machine": {"processor": "cpu", "cpus": 2, "platform": "linux", "python": "3.11", "torch": "2.13",
                           "torch_threads": 2, "gpu": None, "rlkit_commit": "x"}, "overrides": [], "compare": []}
    md = render_markdown(results)
    assert "pass@1_sampled" not in md and "0.042 → 0.312" in md
