"""backend.sampler=vllm against an in-test stub of vLLM's OpenAI API (tests/backends/vllm_stub.py):
token-id prompts, exact sampled ids and logprobs, prompt logprobs, ``n`` on one server, stop tokens,
adapters loaded/unloaded by version, a client bound to version k staying on k, refusals,
least-loaded routing, a dying server as one line, and the launched child process."""

from __future__ import annotations

import gc
import sys
import threading
from dataclasses import fields
from pathlib import Path

import pytest
from helpers import sft_datum
from vllm_stub import Stub, token_logprob

import rlkit
from rlkit.backends.vllm import ServerPool, VllmOptions
from rlkit.backends.vllm.http import VllmServer
from rlkit.errors import BackendUnavailableError, ConfigError, InvalidInputError, OperationError
from rlkit.types import AdamParams, ModelInput, SamplingParams

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')


@pytest.fixture
def stub():
    s = Stub("tiny")
    yield s
    s.close()


@pytest.fixture
def service(stub, tmp_path):
    # the stub's arithmetic "model" is not the tiny model: the model check is off here (tested below)
    svc = rlkit.connect("local", sampler="vllm", vllm={"urls": [stub.url], "check_model": False}, precision="fp32", checkpoint_dir=tmp_path / "ckpt")
    yield svc
    svc.close()


def test_sample_sends_token_ids_and_returns_exact_tokens_and_logprobs(service, stub):
    trainer = service.create_lora_training_client("tiny", rank=4)
    sampler = trainer.create_sampling_client()  # the base model
    out = sampler.sample(ModelInput.from_ints([5, 6, 7]), num_samples=3, sampling_params=SamplingParams(max_tokens=4, temperature=0.7)).result()
    sent = stub.requests[-1]
    assert sent["prompt"] == [5, 6, 7] and sent["model"] == "tiny" and sent["n"] == 3
    assert sent["return_tokens_as_token_ids"] is True and sent["logprobs"] == 0 and sent["temperature"] == 0.7
    assert sent["ignore_eos"] is True and sent["skip_special_tokens"] is False
    assert len(out.sequences) == 3 and len(stub.requests) == 1  # one request for the group
    for seq in out.sequences:
        assert seq.logprobs == [token_logprob(t) / 0.7 for t in seq.tokens]  # processed logprobs: at the temperature
    assert out.usage.prefill_tokens == 3 and out.usage.decode_tokens == sum(len(s.tokens) for s in out.sequences)


def test_stop_tokens_are_the_models_end_of_turn_ids_unless_given(service, stub):
    trainer = service.create_lora_training_client("tiny", rank=4)
    sampler = trainer.create_sampling_client()
    from rlkit.backends.local.models import stop_token_ids

    sampler.sample([5, 6], sampling_params=SamplingParams(max_tokens=8)).result()
    runtime_stops = stub.requests[-1]["stop_token_ids"]
    assert runtime_stops and runtime_stops == stop_token_ids(trainer.get_tokenizer())
    # a stop token the stub will produce: the first token it would sample
    first = sampler.sample([5, 6], sampling_params=SamplingParams(max_tokens=1), stop_token_ids=[]).result().sequences[0].tokens[0]
    assert stub.requests[-1]["stop_token_ids"] == []
    seq = sampler.sample([5, 6], sampling_params=SamplingParams(max_tokens=8), stop_token_ids=[first]).result().sequences[0]
    assert seq.tokens == [first] and seq.stop_reason.value == "stop"
    seq = sampler.sample([5, 6], sampling_params=SamplingParams(max_tokens=3), stop_token_ids=[]).result().sequences[0]
    assert len(seq.tokens) == 3 and seq.stop_reason.value == "length"


def test_compute_logprobs_and_prompt_logprobs_use_vllms_prompt_logprobs(service, stub):
    sampler = service.create_lora_training_client("tiny", rank=4).create_sampling_client()
    lps = sampler.compute_logprobs([3, 4, 5, 6]).result()
    assert stub.requests[-1]["prompt_logprobs"] == 0 and stub.requests[-1]["max_tokens"] == 1
    assert lps == [None] + [token_logprob(t) for t in (4, 5, 6)]
    out = sampler.sample([3, 4, 5], sampling_params=SamplingParams(max_tokens=2), include_prompt_logprobs=True).result()
    assert out.prompt_logprobs == [None, token_logprob(4), token_logprob(5)]


def test_each_version_is_an_adapter_and_a_client_keeps_its_version(service, stub):
    trainer = service.create_lora_training_client("tiny", rank=4)
    v0 = trainer.save_weights_and_get_sampling_client()
    name0, path0 = stub.events[-1][1], Path(stub.events[-1][2])
    assert stub.events[-1][0] == "load" and v0.model == name0 and v0.version == 0
    assert (path0 / "adapter_config.json").is_file() and (path0 / "adapter_model.safetensors").is_file()  # PEFT format
    prompt, params = [9, 8, 7], SamplingParams(max_tokens=5)
    before = v0.sample(prompt, sampling_params=params).result().sequences[0].tokens
    trainer.forward_backward([sft_datum([1, 2, 3, 4, 5])]).result()
    trainer.optim_step(AdamParams(learning_rate=1e-2)).result()
    v1 = trainer.save_weights_and_get_sampling_client()
    assert v1.model != v0.model and set(stub.adapters) == {v0.model, v1.model}
    after = v0.sample(prompt, sampling_params=params).result()  # version 0, after version 1 was published
    assert stub.requests[-1]["model"] == name0 and after.sequences[0].tokens == before
    assert v1.sample(prompt, sampling_params=params).result().sequences[0].tokens != before
    del v0, after
    gc.collect()
    assert ("unload", name0) in stub.events and set(stub.adapters) == {v1.model}  # nobody holds version 0
    assert not path0.exists()  # its directory went with it
    service.close()
    assert stub.adapters == {}


def test_an_answer_from_another_model_is_refused(service, stub):
    sampler = service.create_lora_training_client("tiny", rank=4).save_weights_and_get_sampling_client()
    stub.answer_as = "someone-else"
    with pytest.raises(OperationError, match="not .*stale"):
        sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result()


def test_refusals_are_one_line_before_any_request(service, stub):
    trainer = service.create_lora_training_client("tiny", rank=4)
    sampler = trainer.create_sampling_client()
    caps = trainer.capabilities
    assert caps.engine == "vllm" and not caps.per_request_seed and not caps.constrained_decoding and caps.prompt_logprobs
    with pytest.raises(InvalidInputError, match="seed cannot be honoured on vllm") as err:
        sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2, seed=3))
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidInputError, match="constraint cannot be honoured"):
        sampler.sample([1, 2], sampling_params={"max_tokens": 2, "constraint": {"regex": "[0-9]+"}})
    with pytest.raises(InvalidInputError, match="on_token"):
        sampler.sample([1, 2], on_token=lambda i, t: None)
    with pytest.raises(InvalidInputError, match="outside the vocabulary"):
        sampler.sample([1, 10**6])
    with pytest.raises(InvalidInputError, match="rank=128 is above vllm's limit 64"):
        service.create_lora_training_client("tiny", rank=128)
    assert stub.requests == []


def test_seeds_pass_where_the_servers_honour_them(stub, tmp_path):
    with rlkit.connect("local", sampler="vllm", vllm={"urls": [stub.url], "per_request_seed": True, "check_model": False}, precision="fp32",
                       checkpoint_dir=tmp_path) as svc:
        sampler = svc.create_sampling_client(base_model="tiny")
        with pytest.raises(BackendUnavailableError, match="HTTP 500: RuntimeError: CPU Generator.*resumes"):  # the stub behaves like the CPU build
            sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2, seed=3)).result()
        assert stub.requests[-1]["seed"] == 3


def test_least_loaded_routing_and_a_group_on_one_server(tmp_path):
    pool = ServerPool([VllmServer("http://a:1"), VllmServer("http://b:2"), VllmServer("http://c:3")], "base")
    picks = [pool.pick().url for _ in range(3)]
    assert picks == ["http://a:1", "http://b:2", "http://c:3"]
    pool.done(pool.servers[1])
    assert pool.pick().url == "http://b:2"  # b finished a request: now the least loaded
    stubs = [Stub("tiny", delay_s=0.2), Stub("tiny", delay_s=0.2)]
    try:
        with rlkit.connect("local", sampler="vllm", vllm={"urls": [s.url for s in stubs], "check_model": False}, precision="fp32", checkpoint_dir=tmp_path) as svc:
            sampler = svc.create_sampling_client(base_model="tiny")
            futures = [sampler.sample([i + 1, 2], num_samples=4, sampling_params=SamplingParams(max_tokens=2)) for i in range(6)]
            assert all(len(f.result().sequences) == 4 for f in futures)
        counts = [len(s.requests) for s in stubs]
        assert sum(counts) == 6 and min(counts) >= 2, counts  # spread, each group whole (n=4) on one server
        assert all(r["n"] == 4 for s in stubs for r in s.requests)
    finally:
        for s in stubs:
            s.close()


def test_a_server_that_dies_mid_step_is_one_line(service, stub):
    sampler = service.create_lora_training_client("tiny", rank=4).create_sampling_client()
    sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result()
    stub.close()
    with pytest.raises(BackendUnavailableError) as err:
        sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result()
    message = str(err.value)
    assert "\n" not in message and stub.url in message and "resumes" in message


def test_options_are_checked_and_match_the_schema():
    from rlkit.config import VllmConfig

    assert [(f.name, f.default) for f in fields(VllmConfig)] == [(f.name, f.default) for f in fields(VllmOptions)]
    assert VllmOptions.coerce({}).launch is True and VllmOptions.coerce({"urls": ["http://h:1"]}).launch is False
    with pytest.raises(ConfigError, match="needs servers"):
        VllmOptions.coerce({"launch": False})
    with pytest.raises(ConfigError, match="unknown key"):
        VllmOptions.coerce({"url": "http://x"})
    with pytest.raises(ConfigError, match="backend.sampler='sglang'"):
        rlkit.connect("local", sampler="sglang")


def _fake_vllm(tmp_path: Path) -> str:
    script = tmp_path / "python"
    stub_module = Path(__file__).with_name("vllm_stub.py")
    script.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(stub_module)!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    script.chmod(0o755)
    return str(script)


def test_launch_starts_waits_logs_and_stops_the_server(tmp_path):
    exe = _fake_vllm(tmp_path)
    svc = rlkit.connect("local", sampler="vllm", vllm={"launch": True, "python": exe, "log_dir": str(tmp_path / "run"),
                                                       "startup_timeout_s": 60}, precision="fp32", checkpoint_dir=tmp_path / "ckpt")
    try:
        trainer = svc.create_lora_training_client("tiny", rank=4)
        sampler = trainer.save_weights_and_get_sampling_client()
        assert len(sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result().sequences[0].tokens) == 2
        launched = svc._launched[0]
        log = (tmp_path / "run" / "vllm-server.log").read_text()
        assert "--enable-lora" in log and "--logprobs-mode processed_logprobs" in log and "--max-lora-rank 64" in log
        assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING True" in log
        assert f"# pid {launched.proc.pid}" in log
        assert "-m vllm.entrypoints.openai.api_server" in log
        assert (Path(log.split(" --model ")[1].split()[0]) / "config.json").is_file()  # the tiny model, exported for the server
    finally:
        svc.close()
    assert not launched.alive


def test_a_server_that_crashes_on_start_is_one_line_naming_its_log(tmp_path):
    exe = _fake_vllm(tmp_path)
    with rlkit.connect("local", sampler="vllm", vllm={"launch": True, "python": exe, "log_dir": str(tmp_path), "extra_args": ["--crash"]},
                       precision="fp32", checkpoint_dir=tmp_path / "ckpt") as svc:
        with pytest.raises(BackendUnavailableError, match=r"exited with code 3 while starting \(ValueError: this fake server crashes") as err:
            svc.create_sampling_client(base_model="tiny").sample([1, 2])
        assert "\n" not in str(err.value) and "vllm-server.log" in str(err.value)


def test_a_taken_port_is_refused(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with rlkit.connect("local", sampler="vllm", vllm={"launch": True, "python": _fake_vllm(tmp_path), "port": port},
                           precision="fp32", checkpoint_dir=tmp_path / "ckpt") as svc:
            with pytest.raises(ConfigError, match=f"port={port} is taken"):
                svc.create_sampling_client(base_model="tiny")


def test_no_vllm_installed_is_one_line(tmp_path, monkeypatch):
    from rlkit.backends.vllm import launch

    monkeypatch.setattr(launch, "REPO_ROOT", tmp_path)
    monkeypatch.delenv("RLKIT_VLLM_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="bash scripts/install.sh vllm"):
        launch.find_python(None)


def test_concurrent_publishes_do_not_mix_versions(service, stub):
    trainer = service.create_lora_training_client("tiny", rank=4)
    clients = []
    threads = [threading.Thread(target=lambda: clients.append(trainer.save_weights_and_get_sampling_client())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.version for c in clients) == [0, 1, 2, 3] and len({c.model for c in clients}) == 4
    assert set(stub.adapters) == {c.model for c in clients}


def test_rl_smoke_on_vllm_logs_the_adapter_version_and_mismatch_each_step(stub, tmp_path, capsys):
    """`rlkit train recipe=arithmetic_grpo_smoke backend.sampler=vllm` over the stub: every step samples
    from the adapter published after the step before (no seeds sent), logs its version and the
    sampler-trainer mismatch, and the run leaves no adapter loaded."""
    import json

    from rlkit.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "recipe=arithmetic_grpo_smoke", "backend.sampler=vllm", f"backend.vllm.urls=[{stub.url}]", "backend.vllm.check_model=false", f"run_dir={run_dir}",
                 "cost_preview=true"]) == 0
    assert "rlkit cost (estimate, before the run)" in capsys.readouterr().out  # printed before the run starts
    steps = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "rollout/sampler_version" in m]
    assert [m["rollout/sampler_version"] for m in steps] == [0.0, 1.0, 2.0]
    assert all("mismatch/logprob_diff_abs" in m for m in steps)
    trained = [r for r in stub.requests if r["model"] != "tiny"]
    assert trained and not any("seed" in r for r in stub.requests)
    versions = sorted({r["model"].rsplit("-v", 1)[1] for r in trained}, key=int)
    assert versions[:3] == ["0", "1", "2"]
    assert stub.adapters == {}  # every version unloaded at the end


def test_conformance_runs_on_the_vllm_engine(stub, capsys):
    """`rlkit conformance vllm --vllm-url URL`: the contract's suite on the local trainer + vLLM
    sampler (here the stub, whose scored and sampled logprobs agree); the real server's run is in
    benchmarks/results/vllm/conformance.txt."""
    from rlkit.cli import main

    assert main(["conformance", "vllm", "--vllm-url", stub.url, "--no-parity"]) == 0
    out = capsys.readouterr().out
    assert "per-request seed" in out and out.strip().splitlines()[-1].startswith("18 pass, 0 refused, 0 wrong, 0 error")
    assert stub.requests and not any("seed" in r for r in stub.requests)


@pytest.fixture
def trainer_scores(tmp_path):
    """The trainer's own prompt logprobs of the tiny model (fp32): what a server on the right model answers."""
    local = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path / "local")
    client = local.create_sampling_client(base_model="tiny")
    yield lambda prompt: client.compute_logprobs(prompt).result()[1:]
    local.close()


def test_a_server_on_another_model_is_refused_in_one_line_naming_both(trainer_scores, tmp_path):
    """At connect, a short probe is scored on the server's base model and the trainer's: the same
    logprobs pass; logprobs 0.5 nats a token off (over fp32's 0.1) are one line naming the server's
    model and the trainer's; ``check_model=false`` samples from it anyway (off-policy on purpose)."""
    right, wrong = Stub("tiny"), Stub("other-base-model")
    right.prompt_scorer = trainer_scores
    wrong.prompt_scorer = lambda prompt: [lp - 0.5 for lp in trainer_scores(prompt)]
    try:
        with rlkit.connect("local", sampler="vllm", vllm={"urls": [right.url]}, precision="fp32", checkpoint_dir=tmp_path / "a") as svc:
            sampler = svc.create_sampling_client(base_model="tiny")
            assert len(sampler.sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result().sequences[0].tokens) == 2
            assert [r for r in right.requests if r.get("prompt_logprobs") is not None], "no probe was sent"
        with rlkit.connect("local", sampler="vllm", vllm={"urls": [wrong.url]}, precision="fp32", checkpoint_dir=tmp_path / "b") as svc:
            with pytest.raises(ConfigError) as refused:
                svc.create_sampling_client(base_model="tiny")
            message = str(refused.value)
            assert "\n" not in message and "serves 'other-base-model'" in message and "base model 'tiny'" in message
            assert "0.5 nats" in message and "tolerance 0.1 at precision fp32" in message and "backend.vllm.check_model=false" in message
            assert not [r for r in wrong.requests if r.get("prompt_logprobs") is None], "it sampled from the wrong model"
        probes = len(wrong.requests)
        with rlkit.connect("local", sampler="vllm", vllm={"urls": [wrong.url], "check_model": False}, precision="fp32",
                           checkpoint_dir=tmp_path / "c") as svc:
            svc.create_sampling_client(base_model="tiny").sample([1, 2], sampling_params=SamplingParams(max_tokens=2)).result()
            assert all(r.get("prompt_logprobs") is None for r in wrong.requests[probes:])  # no probe
    finally:
        right.close()
        wrong.close()


def test_rlkit_train_on_a_wrong_model_server_is_one_line_and_exit_2(tmp_path, capsys):
    from rlkit.cli import main

    wrong = Stub("other-base-model")  # its arithmetic logprobs are nothing like the tiny model's
    try:
        with pytest.raises(SystemExit) as done:
            main(["train", "recipe=arithmetic_grpo_smoke", "backend.sampler=vllm", f"backend.vllm.urls=[{wrong.url}]",
                  f"run_dir={tmp_path / 'run'}"])
    finally:
        wrong.close()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("rlkit: error:")]
    assert done.value.code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert "serves 'other-base-model'" in errors[0] and "base model 'tiny'" in errors[0]
    assert not [r for r in wrong.requests if r.get("prompt_logprobs") is None], "it sampled from the wrong model"
