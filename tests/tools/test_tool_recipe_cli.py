"""The tool recipe end to end on the tiny model, through the CLI a user runs: `rlkit repro` with an
SFT warm start (task_sft on the task's tool demonstrations, then RL from each seed's checkpoint)
and a no-tool comparison arm; the cost estimate of the recipe."""

from __future__ import annotations

import json

import pytest
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def rlkit(*args, cwd):
    return warm_rlkit.run(args, cwd=cwd, timeout=600)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_repro_warm_start_and_compare(tmp_path):
    out_dir = tmp_path / "report"
    out = rlkit(
        "repro",
        "recipe=tool_arithmetic_grpo_smoke",
        "seeds=2",
        "jobs=2",
        f"out={out_dir}",
        "warm_start=sft",
        "sft.train.steps=1",
        "train.steps=1",
        "compare=arithmetic_grpo_smoke",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads((out_dir / "report.json").read_text())
    assert list(report["arms"]) == ["sft", "sft+rl", "arithmetic_grpo_smoke"]
    sft, rl = report["arms"]["sft"]["runs"], report["arms"]["sft+rl"]["runs"]
    for s in (0, 1):
        assert sft[s]["steps"] == 1 and rl[s]["steps"] == 1
        # RL starts from that seed's SFT checkpoint: its first evaluation is the SFT model's last
        assert rl[s]["before"]["eval/greedy_accuracy"] == sft[s]["after"]["eval/greedy_accuracy"]
        config = (out_dir / "sft_rl" / f"seed_{s}" / "config.yaml").read_text()
        assert f"{out_dir}/sft/seed_{s}/checkpoints" in config
    # the RL runs went through the tool environment: its metrics are logged every step
    step = lines(out_dir / "sft_rl" / "seed_0" / "metrics.jsonl")[0]
    for key in (
        "reward/tool_calls",
        "reward/malformed_calls",
        "reward/tool_errors",
        "reward/turns",
        "reward/used_tool",
        "reward/correct_with_tool",
        "reward/correct_without_tool",
        "eval/greedy/turns",
        "tokens/trained",
    ):
        assert key in step, key
    assert lines(out_dir / "sft" / "seed_0" / "metrics.jsonl")[0]["tokens/trained"] > 0
    md = (out_dir / "report.md").read_text()
    assert "| sft+rl |" in md and "| arithmetic_grpo_smoke |" in md and "starts from each seed's sft checkpoint" in md
    transcript = lines(next((out_dir / "sft_rl" / "seed_0" / "transcripts").glob("step_*.jsonl")))
    assert transcript and all("turns" in row for row in transcript)

    # the cost estimate and repro's validation, in process (each subprocess costs seconds)
    from rlkit.cli import compose
    from rlkit.cost import estimate
    from rlkit.errors import ConfigError
    from rlkit.repro import repro

    est = estimate(compose(["recipe=tool_arithmetic_grpo_smoke"]))
    assert est["prefill"] > 0 and est["sampled"] == 3 * 2 * 4 * 30 * 3  # steps * groups * G * max_tokens * turns
    with pytest.raises(ConfigError, match="warm_start='dpo'"):
        repro("tool_arithmetic_grpo_smoke", 2, tmp_path / "x", [], warm_start="dpo")
    with pytest.raises(ConfigError, match="compare=sft_gsm8k_smoke: repro compares RL recipes"):
        repro("tool_arithmetic_grpo_smoke", 2, tmp_path / "x", [], compare=["sft_gsm8k_smoke"])
