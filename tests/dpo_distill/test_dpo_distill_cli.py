"""The DPO and distillation recipes end to end on the tiny model: 2-step runs through the CLI,
bad input as one line on stderr with exit code 2, and in-process runs that count reference calls
and check which tokens each teacher scored."""

import json
import os
from pathlib import Path

import pytest
import warm_rlkit

from distill_fixtures import OTHER_TEMPLATE, other_vocab_tokenizer, retemplated_tokenizer, save_teacher_model
from rlkit import cli

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


def rlkit(*args, cwd):
    return warm_rlkit.run(["train", *args, "logger.console=false"], cwd=cwd, timeout=300, env={**os.environ})


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def assert_user_error(proc, *fragments):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("rlkit: error: ")
    for fragment in fragments:
        assert fragment in last, last


@pytest.fixture(scope="module")
def prompt_distillation_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("pd")
    proc = rlkit("recipe=prompt_distillation_smoke", "run_dir=run", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd / "run"


def test_dpo_gsm8k_smoke_runs_two_steps(tmp_path):
    proc = rlkit("recipe=dpo_gsm8k_smoke", "run_dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    metrics = lines(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for key in ("train/loss", "train/accuracy", "train/reward_margin", "train/chosen_reward", "train/rejected_reward", "train/grad_norm", "reference/calls"):
        assert key in metrics[0] and key in metrics[1], key
    for key in ("eval/loss", "eval/preference_accuracy", "eval/logp_accuracy", "eval/reward_margin", "eval/answer_accuracy"):
        assert key in metrics[0] and key in metrics[2], key
    # 4 held-out pairs + 2 pairs per step, each side scored once by the reference
    assert metrics[0]["reference/calls"] == 2 * (4 + 2) and metrics[1]["reference/calls"] == 2 * (4 + 4)
    assert metrics[2]["reference/calls"] == metrics[1]["reference/calls"]  # the final evaluation reused the cache
    assert abs(metrics[0]["eval/reward_margin"]) < 1e-3  # step 0: the policy is the reference
    assert [c["step"] for c in lines(run / "checkpoints.jsonl")] == [1, 2]
    assert sorted(p.name for p in (run / "transcripts").iterdir()) == ["step_000000.jsonl", "step_000002.jsonl"]


def test_prompt_distillation_smoke_runs_two_steps(prompt_distillation_run):
    metrics = lines(prompt_distillation_run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for key in ("train/reverse_kl", "train/loss", "reward/mean", "train/grad_norm", "teacher/calls"):
        assert key in metrics[1], key
    for key in ("eval/greedy_accuracy", "eval/reverse_kl", "eval/sampled_accuracy", "eval/teacher_greedy_accuracy"):
        assert key in metrics[0], key
    assert "eval/reverse_kl" in metrics[2]
    # step 0: 3 problems x 2 eval samples + 2 problems x 2 train samples scored by the teacher
    assert metrics[0]["teacher/calls"] == 3 * 2 + 2 * 2
    assert list((prompt_distillation_run / "transcripts").glob("step_*.jsonl"))


@pytest.mark.parametrize("recipe", ["onpolicy_distill_smoke", "offpolicy_distill_smoke"])
def test_distilling_a_trained_checkpoint_runs_two_steps(recipe, prompt_distillation_run, tmp_path):
    teacher = lines(prompt_distillation_run / "checkpoints.jsonl")[-1]["checkpoint"]
    proc = rlkit(f"recipe={recipe}", f"train.teacher.checkpoint={teacher}", "run_dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = lines(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert "eval/reverse_kl" in metrics[0] and "eval/greedy_accuracy" in metrics[2]
    assert ("train/reverse_kl" if recipe.startswith("onpolicy") else "train/nll") in metrics[1]
    assert len(lines(tmp_path / "run" / "checkpoints.jsonl")) == 2


def test_bad_ids_and_bad_pairs_are_one_line_errors(tmp_path):
    proc = rlkit("recipe=dpo_gsm8k_smoke", "train.reference=local:///no/such/checkpoint", "run_dir=a", cwd=tmp_path)
    assert_user_error(proc, "train.reference='local:///no/such/checkpoint'", "no checkpoint")
    proc = rlkit("recipe=onpolicy_distill_smoke", "train.teacher.checkpoint=local:///missing/teacher", "run_dir=b", cwd=tmp_path)
    assert_user_error(proc, "train.teacher.checkpoint='local:///missing/teacher'")
    proc = rlkit("recipe=offpolicy_distill_smoke", "run_dir=c", cwd=tmp_path)
    assert_user_error(proc, "train.teacher: no teacher given")
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps({"prompt": "q", "chosen": "same", "rejected": "same"}) + "\n")
    proc = rlkit("recipe=dpo_gsm8k_smoke", "train.format.transform=null", f"data.train.path={bad}", "data.eval=null", "run_dir=d", cwd=tmp_path)
    assert_user_error(proc, f"{bad}:2: chosen and rejected are identical")


# -- in process: what the loops send to the reference and the teacher ---------------------------------


def run_in_process(tmp_path, monkeypatch, overrides, record_calls=True):
    from rlkit.backends.local.clients import LocalSamplingClient

    calls = []
    original = LocalSamplingClient.compute_logprobs

    def recording(self, prompt):
        calls.append((self._runtime.loaded.name, self.weights_key, list(prompt)))
        return original(self, prompt)

    monkeypatch.setattr(LocalSamplingClient, "compute_logprobs", recording)
    cfg = cli.compose(overrides + ["logger.console=false", "backend.num_threads=null"])
    cli.execute(cfg, tmp_path / "run")
    return calls, lines(tmp_path / "run" / "metrics.jsonl")


def test_dpo_scores_each_sequence_once_across_epochs_and_evaluations(tmp_path, monkeypatch):
    calls, metrics = run_in_process(tmp_path, monkeypatch, [
        "recipe=dpo_gsm8k_smoke", "data.train.limit=4", "data.eval.limit=2", "train.steps=6",  # 3 epochs of 2 steps
        "train.eval_every=2", "train.generate.examples=0", "train.checkpoint_every=0",
    ])
    sequences = [tuple(tokens) for _, _, tokens in calls]
    assert len(sequences) == len(set(sequences)) == 2 * (4 + 2)  # every side of every pair, once
    assert all(name == "tiny" and key == "" for name, key, _ in calls)  # the frozen base model
    assert metrics[-1]["reference/calls"] == 12
    assert sum("eval/loss" in m for m in metrics) == 4  # steps 0, 2, 4 and the end


def test_dpo_with_a_checkpoint_as_reference(tmp_path, monkeypatch, prompt_distillation_run):
    reference = lines(prompt_distillation_run / "checkpoints.jsonl")[-1]["checkpoint"]
    calls, metrics = run_in_process(tmp_path, monkeypatch, [
        "recipe=dpo_gsm8k_smoke", "data.train.limit=2", "data.eval.limit=1", "train.steps=1",
        "train.generate.examples=0", f"train.reference={reference}",
    ])
    assert calls and all(key == reference for _, key, _ in calls)
    assert abs(metrics[0]["eval/reward_margin"]) > 0  # the policy (base) differs from this reference


def test_a_teacher_with_another_chat_template_scores_its_own_rendering(tmp_path, monkeypatch):
    teacher_dir = save_teacher_model(tmp_path / "teacher", retemplated_tokenizer())
    calls, metrics = run_in_process(tmp_path, monkeypatch, [
        "recipe=prompt_distillation_smoke", f"train.teacher.base_model={teacher_dir}", "train.teacher.system_prompt=Be brief.",
        "train.checkpoint_every=0",
    ])
    tok = retemplated_tokenizer(OTHER_TEMPLATE)
    teacher_calls = [tokens for name, _, tokens in calls if name == teacher_dir]
    assert teacher_calls and len(teacher_calls) == len(calls)
    for tokens in teacher_calls:
        text = tok.decode(tokens)
        assert text.startswith("### System:\nBe brief.<|endoftext|>\n### User:\nWhat is ") and "### Assistant:\n" in text
        assert "<|im_start|>" not in text  # never the student's ChatML rendering
    assert metrics[-1]["eval/reverse_kl"] == metrics[-1]["eval/reverse_kl"]  # finite


def test_a_teacher_with_another_vocabulary_distils_through_its_own_tokens(tmp_path, monkeypatch):
    teacher_tok = other_vocab_tokenizer()
    teacher_dir = save_teacher_model(tmp_path / "teacher", teacher_tok)
    for recipe in ("prompt_distillation_smoke", "offpolicy_distill_smoke"):
        calls, metrics = run_in_process(tmp_path / recipe, monkeypatch, [
            f"recipe={recipe}", f"train.teacher.base_model={teacher_dir}", "train.checkpoint_every=0",
        ])
        assert all(max(tokens) < len(teacher_tok) for name, _, tokens in calls if name == teacher_dir)
        assert [m["step"] for m in metrics] == [0, 1, 2]
        assert abs(metrics[0]["eval/reverse_kl"]) < 1e3
