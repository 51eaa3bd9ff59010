"""``device=``: one torch device for weights, caches, autocast and random draws. This machine has no
GPU, so these tests run the device-passing code paths with ``device="cpu"`` named explicitly;
``benchmarks/gpu_check.sh`` runs them on a GPU."""

import pytest
import torch

import rlkit
from helpers import sft_datum
from rlkit.backends.local.device import autocast, generator, resolve_device
from rlkit.backends.local.sampler import SampleRequest
from rlkit.errors import InvalidInputError
from rlkit.types import SamplingParams

PROMPT = [1, 85, 91, 326, 71, 79, 201]


def test_default_device_is_cuda_when_available():
    expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert resolve_device(None) == expected
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, message", [("tpu", "device='tpu': not a torch device"), ("meta", "expected cpu, cuda[:N] or mps")])
def test_bad_device_names_are_one_line_errors(name, message):
    with pytest.raises(InvalidInputError) as info:
        resolve_device(name)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_refused_at_connect(tmp_path):
    with pytest.raises(InvalidInputError, match="sees no CUDA device"):
        rlkit.connect("local", device="cuda", checkpoint_dir=tmp_path)


def test_autocast_and_generators_follow_the_device():
    cpu = torch.device("cpu")
    with autocast(cpu, "bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(cpu, "fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    g = generator(cpu, 7)
    assert g.device == cpu and torch.rand(3, generator=g).tolist() == torch.rand(3, generator=generator(cpu, 7)).tolist()


def test_an_explicit_device_places_trainer_sampler_and_draws(tmp_path):
    svc = rlkit.connect("local", device="cpu", precision="fp32", checkpoint_dir=tmp_path)
    try:
        assert svc.device == torch.device("cpu")
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
        engine = trainer._engine
        assert engine.device == svc.device and {p.device for p in engine.model.parameters()} == {svc.device}
        out = trainer.forward_backward([sft_datum(PROMPT + [5, 6], prompt_len=len(PROMPT))]).result()
        assert out.loss_fn_outputs[0]["logprobs"].to_torch().device == torch.device("cpu")
        trainer.optim_step().result()
        sampler = svc._runtimes["tiny"].sampler.sampler
        assert sampler.device == svc.device and {p.device for p in sampler.model.parameters()} == {svc.device}
        request = SampleRequest(PROMPT, 2, SamplingParams(max_tokens=4, temperature=1.0, seed=3))
        sampler.sample([request])
        assert request._generator is not None and request._generator.device == sampler.device
        # a checkpoint's adapter (loaded on the CPU) merges into the sampler's weights on its device
        path = trainer.save_weights_for_sampler(name="w").result().model_package_arn
        seqs = svc.create_sampling_client(model_package_arn=path).sample(PROMPT, num_samples=2, sampling_params=SamplingParams(max_tokens=3, seed=1)).result()
        assert len(seqs.sequences) == 2
        trainer.stop()
    finally:
        svc.close()


def test_same_seed_same_samples_through_device_generators(tmp_path):
    svc = rlkit.connect("local", device="cpu", precision="fp32", checkpoint_dir=tmp_path)
    try:
        sc = svc.create_sampling_client(base_model="tiny")
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=11)
        a = sc.sample(PROMPT, num_samples=3, sampling_params=params).result()
        b = sc.sample(PROMPT, num_samples=3, sampling_params=params).result()
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    finally:
        svc.close()


def test_backend_config_has_a_device():
    from rlkit import cli
    from rlkit.config import LocalBackendConfig

    assert LocalBackendConfig().device is None
    cfg = cli.compose(["recipe=sft_gsm8k_smoke", "backend.device=cpu"])
    assert cfg.backend.device == "cpu"


def test_each_rank_takes_its_own_gpu_under_torchrun(monkeypatch):
    """On N ranks ``device=None``/``"cuda"`` is ``cuda:LOCAL_RANK`` (rank k of a node on GPU k);
    ``cuda:N`` stays what it names; a rank beyond the node's GPUs is one line. CUDA is simulated
    here (no GPU on this machine): only the choice of index is under test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(None) == torch.device("cuda", 0)  # one process: the first GPU
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device(None) == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(InvalidInputError, match=r"only 2 CUDA device\(s\) \(rank 2 of this node takes GPU 2\)"):
        resolve_device(None)
