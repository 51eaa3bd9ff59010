"""Serving a live session's weights: ``FixedModel.update`` in-process, ``RunFollower`` on a run
directory, ``--checkpoint``; and ``rlkit serve`` as a real subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from argparse import Namespace

import httpx
import openai
import pytest

from rlkit.chat import conversation_datum, prompt_tokens
from rlkit.serve import FixedModel, RunFollower, create_app, start_server
from rlkit.types import AdamParams, SamplingParams

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

MESSAGES = [{"role": "user", "content": "Greet me."}]
TARGET = "hello hello hello hello"


@pytest.fixture(scope="module")
def trained(serve_service):
    """A tiny LoRA session trained a few steps to answer TARGET; yields (trainer, checkpoint id)."""
    trainer = serve_service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    datum = conversation_datum(trainer.get_tokenizer(), MESSAGES + [{"role": "assistant", "content": TARGET}])
    for _ in range(8):
        trainer.forward_backward([datum]).result()
        trainer.optim_step(AdamParams(learning_rate=3e-2)).result()
    checkpoint = trainer.save_state("serve test").result().model_package_arn
    yield trainer, checkpoint
    trainer.stop()


def greedy(client, n_tokens=8):
    tok = client.get_tokenizer()
    seq = client.sample(prompt_tokens(tok, MESSAGES), 1, SamplingParams(max_tokens=n_tokens, temperature=0)).result().sequences[0]
    return tok.decode(seq.tokens, skip_special_tokens=True)


def ask(server, model):
    r = httpx.post(server.base_url + "/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], r.headers["x-rlkit-checkpoint"], r.json()["system_fingerprint"]


def test_update_swaps_in_a_live_sessions_weights(serve_service, trained):
    trainer, _ = trained
    base = serve_service.create_sampling_client(base_model="tiny")
    source = FixedModel(base, name="live", base_model="tiny")
    with start_server(create_app(source)) as server:
        before, header, fingerprint = ask(server, "live")
        assert header == "base" and before == greedy(base)
        live = trainer.save_weights_and_get_sampling_client()
        source.update(live, step=trainer.step)
        after, header2, fingerprint2 = ask(server, "live")
        assert header2 == live.weights_key and fingerprint2 != fingerprint
        assert after == greedy(live) and after != before
        card = httpx.get(server.base_url + "/models").json()["data"][0]
        assert card["rlkit"]["checkpoint"] == live.weights_key and card["rlkit"]["step"] == trainer.step


def test_run_follower_serves_the_newest_checkpoint(serve_service, trained, tmp_path):
    _, checkpoint = trained
    run = tmp_path / "my-run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: sft_gsm8k\nmodel:\n  base_model: tiny\n  rank: 4\n")
    follower = RunFollower(serve_service, run, poll_seconds=0.05)
    try:
        with start_server(create_app(follower)) as server:
            text, header, _ = ask(server, "my-run")
            assert header == "base"
            record = {"step": 8, "checkpoint": checkpoint, "time": time.time(), "loop_state": {}}
            (run / "checkpoints.jsonl").write_text(json.dumps({**record, "step": 4, "checkpoint": "local:///nowhere"}) + "\n" + json.dumps(record) + "\n")
            deadline = time.monotonic() + 10
            while follower.current().checkpoint != checkpoint and time.monotonic() < deadline:
                time.sleep(0.05)
            text2, header2, _ = ask(server, "my-run")
            assert header2 == checkpoint and text2 == greedy(serve_service.create_sampling_client(model_package_arn=checkpoint))
            assert httpx.get(server.url + "/health").json()["step"] == 8
            # a checkpoint that cannot be loaded keeps the previous weights serving
            (run / "checkpoints.jsonl").write_text(json.dumps({**record, "step": 9, "checkpoint": "local:///nowhere"}) + "\n")
            assert follower.refresh() is False and follower.current().checkpoint == checkpoint
    finally:
        follower.close()


def test_checkpoint_source_from_cli_arguments(serve_service, trained):
    from rlkit.serve.cli import build_source

    _, checkpoint = trained
    source = build_source(Namespace(follow=None, checkpoint=checkpoint, served_model_name=None, model=None, poll_seconds=1.0), serve_service)
    snap = source.current()
    assert snap.base_model == "tiny" and snap.checkpoint == checkpoint and snap.step == 8
    assert source.accepts(checkpoint) and source.name == checkpoint.rstrip("/").split("/")[-1]


def test_rlkit_serve_subprocess(tmp_path):
    """``python -m rlkit serve --model tiny --port 0`` end to end, with the key from the environment."""
    env = {**os.environ, "RLKIT_API_KEY": "sk-sub", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlkit", "serve", "--model", "tiny", "--port", "0", "--log-level", "warning"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        url, seen = None, []
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(r"at (http://\S+/v1)", line)
            url = match.group(1) if match else None
        assert url, "rlkit serve did not announce its URL:\n" + "".join(seen)
        assert "auth: bearer key" in seen[-1]
        with openai.OpenAI(base_url=url, api_key="sk-sub", max_retries=0) as client:
            r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
            assert r.usage.completion_tokens <= 4
        with pytest.raises(openai.AuthenticationError), openai.OpenAI(base_url=url, api_key="nope", max_retries=0) as bad:
            bad.models.list()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
