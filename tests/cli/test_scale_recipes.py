"""The large-model recipes (verl's GSM8K baselines, the seed's two experiments) compose as written,
declare their cost preview, and the preview prints rlkit cost's estimate before a run — measuring
prompt lengths with the embedded tokenizer, and saying so, where the model's own is not here."""

from __future__ import annotations


import pytest

from rlkit import cli
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

RECIPES = {  # recipe -> (base model, steps, problems per step, samples per problem, max_tokens, turns)
    "gsm8k_grpo_qwen2.5_0.5b": ("Qwen/Qwen2.5-0.5B-Instruct", 1751, 64, 5, 1024, 1),
    "gsm8k_grpo_qwen2.5_1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", 1751, 64, 5, 1024, 1),
    "gsm8k_grpo_gpt_oss_20b": ("openai/gpt-oss-20b", 10, 40, 8, 1024, 1),
    "code_grpo_gpt_oss_20b": ("openai/gpt-oss-20b", 50, 128, 8, 2048, 2),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_composes_as_written(recipe):
    cfg = cli.compose([f"recipe={recipe}"])
    base, steps, b, g, m, turns = RECIPES[recipe]
    t = cfg.train
    assert (cfg.model.base_model, t.steps, t.groups_per_batch, t.group_size, t.max_tokens, t.rollout.max_turns) == (base, steps, b, g, m, turns)
    assert cfg.cost_preview is True
    with_vllm = cli.compose([f"recipe={recipe}", "backend.sampler=vllm", "backend.vllm.urls=[http://gpu-node:8000]"])
    assert with_vllm.backend.sampler == "vllm" and list(with_vllm.backend.vllm.urls) == ["http://gpu-node:8000"]


def test_verl_baselines_keep_verls_setup():
    cfg = cli.compose(["recipe=gsm8k_grpo_qwen2.5_0.5b"])
    assert cfg.model.rank == 32 and cfg.train.task.num_train is None and cfg.train.eval.problems == 1319
    assert [(x.name, x.weight, x.estimator) for x in cfg.loss.extra_terms] == [("kl_penalty", 0.001, "k3")]


def test_cfg_job_prints_the_config_without_running():
    out = warm_rlkit.run(["train", "recipe=gsm8k_grpo_qwen2.5_1.5b", "--cfg", "job"], timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "base_model: Qwen/Qwen2.5-1.5B-Instruct" in out.stdout and "cost_preview: true" in out.stdout


def test_the_preview_prints_the_estimate_with_a_stated_tokenizer(capsys):
    from rlkit.cost import preview

    cfg = cli.compose(["recipe=gsm8k_grpo_qwen2.5_0.5b", "train.task.num_train=8", "train.task.num_test=4", "train.eval.problems=4"])
    est = preview(cfg)
    out = capsys.readouterr().out
    assert est is not None and est["sampled"] == 1751 * 64 * 5 * 1024
    assert "rlkit cost (estimate, before the run)" in out and f"{est['sampled']:,.0f}" in out
    assert "smollm2-135m-instruct's tokenizer: Qwen/Qwen2.5-0.5B-Instruct's is not on this machine" in out
