"""The SFT loop in process on the tiny model: pipelined submission, token-budget batches, the
learning-rate schedule, evaluation and checkpoint cadence, aggregation, and learning."""

import json

import pytest

from rlkit import cli

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

BASE = [
    "recipe=sft_gsm8k_smoke",
    "backend.num_threads=null",  # don't pin this pytest process's torch threads
    "logger.console=false",
    "data.train.limit=48",
    "data.eval.limit=4",
    "train.generate.examples=0",
]


class Recorder:
    """Wraps a training client: records when each operation is submitted and when its result is awaited."""

    def __init__(self, inner, events):
        self._inner, self.events = inner, events

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if name not in ("forward_backward", "optim_step", "forward", "save_state", "save_weights_for_sampler"):
            return attr

        def call(*args, **kwargs):
            index = sum(1 for e in self.events if e[0] == "submit" and e[1] == name)
            self.events.append(("submit", name, index))
            future = attr(*args, **kwargs)
            original = future.result

            def result(*a, **k):
                self.events.append(("wait", name, index))
                return original(*a, **k)

            future.result = result
            return future

        return call


def run_loop(tmp_path, *overrides, events=None, monkeypatch=None):
    cfg = cli.compose(BASE + list(overrides))
    if events is not None:
        import rlkit.scaffold as scaffold

        original = scaffold.open_training_client
        monkeypatch.setattr(scaffold, "open_training_client", lambda cfg, service, record=None: Recorder(original(cfg, service, record), events))
    result = cli.execute(cfg, tmp_path / "run")
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return result, metrics, cfg


def test_next_step_is_queued_before_the_previous_result_is_awaited(tmp_path, monkeypatch):
    events = []
    _, metrics, _ = run_loop(tmp_path, "train.steps=5", "train.eval_every=2", "train.checkpoint_every=2", events=events, monkeypatch=monkeypatch)
    position = {e: i for i, e in enumerate(events)}
    for step in range(1, 5):
        assert position[("submit", "forward_backward", step)] < position[("wait", "forward_backward", step - 1)]
    # the checkpoint after step 2 is queued behind optim_step 1 and ahead of forward_backward 2
    first_save = position[("submit", "save_state", 0)]
    assert position[("submit", "optim_step", 1)] < first_save < position[("submit", "forward_backward", 2)]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4, 5]


def test_batches_schedule_evaluation_and_checkpoints(tmp_path):
    result, metrics, cfg = run_loop(
        tmp_path, "train.steps=6", "train.batch_tokens=700", "train.learning_rate=0.01", "train.warmup_steps=2",
        "train.lr_schedule=linear", "train.min_lr_ratio=0.0", "train.eval_every=4", "train.checkpoint_every=4",
    )
    train = [m for m in metrics if "train/nll" in m]
    assert len(train) == 6
    for m in train:  # token budget (a single long sequence may exceed it alone)
        assert m["train/tokens"] <= 700 or m["train/sequences"] == 1
        assert abs(m["train/loss"] - m["train/nll"]) < 1e-4  # token_mean: the loss is the mean NLL
    from omegaconf import OmegaConf

    t = OmegaConf.to_object(cfg.train)
    assert [m["train/lr"] for m in train] == pytest.approx([0.005, 0.01, 0.01, 0.01 * 2 / 3, 0.01 / 3, 0.0])
    assert [m["step"] for m in metrics if "eval/nll" in m] == [0, 4, 6]
    checkpoints = [json.loads(x) for x in (tmp_path / "run" / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints] == [4, 6]
    assert result["eval/nll"] == metrics[-1]["eval/nll"]
    assert t.learning_rate_at(5, 6) == 0.0


def test_tiny_model_learns(tmp_path):
    _, metrics, _ = run_loop(tmp_path, "train.steps=12", "train.learning_rate=0.01", "train.eval_every=0", "data.train.limit=8", "train.batch_tokens=4096")
    train = [m["train/nll"] for m in metrics if "train/nll" in m]
    assert train[-1] < train[0] - 0.5  # 8 examples, every step sees all of them
    evals = [m["eval/nll"] for m in metrics if "eval/nll" in m]
    assert len(evals) == 2 and evals[-1] < evals[0]


def test_sum_aggregation_scales_with_tokens(tmp_path):
    _, metrics, _ = run_loop(tmp_path, "train.steps=1", "train.aggregation=sum")
    m = metrics[0]
    assert m["train/loss"] == pytest.approx(m["train/nll"] * m["train/trained_tokens"], rel=1e-5)


def test_constant_aggregation_needs_its_constant(tmp_path):
    from rlkit.errors import RlkitError

    with pytest.raises(RlkitError, match="constant"):
        run_loop(tmp_path, "train.steps=1", "train.aggregation=constant")
