"""``rlkit serve`` never serves a corrupt or non-finite checkpoint: ``--follow`` keeps the newest
checkpoint that verifies and ``/health`` reports the refused one; ``--checkpoint`` refuses to start."""

from __future__ import annotations

import json
import shutil
import time
from argparse import Namespace
from pathlib import Path

import httpx
import pytest
import torch

from rlkit.backends.local import checkpoints as ckpt
from rlkit.errors import CheckpointCorruptError
from rlkit.serve import RunFollower, create_app, start_server
from rlkit.serve.cli import build_source


@pytest.fixture(scope="module")
def checkpoints(serve_service, tmp_path_factory):
    """Three adapter checkpoints of one session: good, corrupt (bytes overwritten), non-finite."""
    trainer = serve_service.create_lora_training_client("tiny", rank=4, alpha=8, seed=5)
    try:
        good = trainer.save_weights_for_sampler(name="good").result().model_package_arn
        bad_path = tmp_path_factory.mktemp("bad") / "corrupt"
        shutil.copytree(ckpt.resolve(good), bad_path)
        adapter = bad_path / "adapter_model.safetensors"
        data = bytearray(adapter.read_bytes())
        data[-600:-100] = bytes((b + 0x5A) % 256 for b in data[-600:-100])
        adapter.write_bytes(bytes(data))
        with torch.no_grad():
            trainer._engine.named_trainable[0][1].fill_(float("nan"))
        nan = trainer.save_weights_for_sampler(name="nan").result().model_package_arn
    finally:
        trainer.stop()
    return {"good": good, "corrupt": ckpt.checkpoint_id(bad_path), "nan": nan}


def make_run(tmp_path, records):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text("recipe: sft_gsm8k\nmodel:\n  base_model: tiny\n  rank: 4\n")
    write_records(run, records)
    return run


def write_records(run, records):
    text = "".join(
        json.dumps({"step": s, "checkpoint": c, "time": time.time(), "loop_state": {}}) + "\n" for s, c in records
    )
    tmp = Path(run) / ".checkpoints.tmp"
    tmp.write_text(text)
    tmp.replace(Path(run) / "checkpoints.jsonl")


def test_follow_serves_the_newest_good_checkpoint_and_health_reports_the_refused_one(
    serve_service, checkpoints, tmp_path
):
    run = make_run(tmp_path, [(2, checkpoints["good"]), (4, checkpoints["corrupt"])])
    follower = RunFollower(serve_service, run, poll_seconds=3600)
    try:
        assert follower.current().checkpoint == checkpoints["good"]  # the corrupt step 4 is not served
        with start_server(create_app(follower)) as server:
            health = httpx.get(server.url + "/health").json()
            assert (
                health["status"] == "degraded" and health["checkpoint"] == checkpoints["good"] and health["step"] == 2
            )
            assert health["refused"]["step"] == 4 and health["refused"]["checkpoint"] == checkpoints["corrupt"]
            assert "adapter_model.safetensors does not match its SHA-256" in health["refused"]["reason"]
            r = httpx.post(
                server.base_url + "/chat/completions",
                json={"model": "run", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200 and r.headers["x-rlkit-checkpoint"] == checkpoints["good"]

            write_records(run, [(2, checkpoints["good"]), (4, checkpoints["corrupt"]), (6, checkpoints["nan"])])
            assert follower.refresh() is False and follower.current().checkpoint == checkpoints["good"]
            health = httpx.get(server.url + "/health").json()
            assert health["status"] == "degraded" and health["refused"]["step"] == 6
            assert "holds NaN or inf" in health["refused"]["reason"]

            again = serve_service.create_lora_training_client("tiny", rank=4, alpha=8, seed=6)
            try:
                fresh = again.save_weights_for_sampler(name="fresh").result().model_package_arn
            finally:
                again.stop()
            write_records(
                run, [(2, checkpoints["good"]), (4, checkpoints["corrupt"]), (6, checkpoints["nan"]), (8, fresh)]
            )
            assert follower.refresh() is True and follower.current().checkpoint == fresh
            health = httpx.get(server.url + "/health").json()
            assert health["status"] == "ok" and "refused" not in health and health["step"] == 8
    finally:
        follower.close()


def test_follow_with_only_bad_checkpoints_serves_the_base_model_and_says_so(serve_service, checkpoints, tmp_path):
    run = make_run(tmp_path, [(2, checkpoints["nan"])])
    follower = RunFollower(serve_service, run, poll_seconds=3600)
    try:
        assert follower.current().checkpoint == ""
        assert follower.health()["status"] == "degraded" and follower.health()["refused"]["step"] == 2
    finally:
        follower.close()


@pytest.mark.parametrize(
    "which, reason", [("corrupt", "adapter_model.safetensors does not match"), ("nan", "holds NaN or inf")]
)
def test_serve_checkpoint_refuses_a_bad_checkpoint(serve_service, checkpoints, which, reason):
    args = Namespace(follow=None, checkpoint=checkpoints[which], served_model_name=None, model=None, poll_seconds=1.0)
    with pytest.raises(CheckpointCorruptError, match=reason):
        build_source(args, serve_service)
