"""Every supported model family loads, trains a LoRA and samples on the local backend, checked
against the model's own forward, with a random-weight model of the family's real architecture at
tiny dimensions (``load_model("tiny-<family>")``, :mod:`rlkit.backends.local.families`)."""

import pytest
import torch

from helpers import sft_datum
from rlkit.backends.local.families import TINY_FAMILIES, logit_softcap, softcapped_target_logprobs
from rlkit.backends.local.models import load_model
from rlkit.types import AdamParams

FAMILIES = sorted(TINY_FAMILIES)
FUSED = {"llama", "qwen2", "qwen3", "mistral"}  # the sampler's lean decode; the rest: the model's own forward
ATTN, MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]
TARGETS = {f: ATTN + MLP for f in FAMILIES} | {"qwen3-moe": ATTN, "gpt-oss": ATTN}  # MoE experts are fused 3-D parameters, frozen
PROMPT = [1, 85, 91, 326, 71, 79, 201, 17, 44, 260, 300, 12, 9, 140, 141, 142, 143, 5]  # 18 tokens > the 8-token windows


@pytest.fixture(scope="module")
def family_service(tmp_path_factory):
    import rlkit

    svc = rlkit.connect("local", precision="fp32", device="cpu", checkpoint_dir=tmp_path_factory.mktemp("families"))
    yield svc
    svc.close()


def own_logprobs(model, tokens):
    """``log p(tokens[i+1] | tokens[:i+1])`` from the model's own forward (its logits, soft-capped or not)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


def trainer_logprobs(trainer, sequences):
    out = trainer.forward([sft_datum(t) for t in sequences]).result()
    return [o["logprobs"].to_torch()[:-1] for o in out.loss_fn_outputs]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_loads_trains_and_samples_like_its_own_forward(family, family_service):
    name = f"tiny-{family}"
    reference = load_model(name).model.eval()  # the same fixed-seed weights, run by transformers
    trainer = family_service.create_lora_training_client(name, rank=4, alpha=8, seed=0)
    try:
        # LoRA sits on the family's projections, and only there
        targets = sorted({path.rsplit(".", 1)[-1] for path in trainer._engine.lora_modules()})
        assert targets == sorted(TARGETS[family])
        assert all("experts" not in n and "router" not in n for n, _ in trainer._engine.named_trainable)

        # scored: one sequence, and a group sharing a 18-token prompt (the shared-prefix path)
        group = [PROMPT + [30, 31, 32, 33], PROMPT + [40, 41], PROMPT + [50, 51, 52, 53, 54, 55]]
        for got, seq in zip(trainer_logprobs(trainer, group), group):
            torch.testing.assert_close(got, own_logprobs(reference, seq), atol=1e-5, rtol=0)
        trainer._engine.micro_batch_tokens = len(PROMPT) + 6  # over the budget: one row a part, the prompt once
        for got, seq in zip(trainer_logprobs(trainer, group), group):
            torch.testing.assert_close(got, own_logprobs(reference, seq), atol=1e-5, rtol=0)
        trainer._engine.micro_batch_tokens = 2048

        # sampled: the reported logprobs are the model's own (temperature 1) for the sampled tokens
        sampler = family_service.create_sampling_client(base_model=name)
        path = sampler._runtime.sampler.sampler.decode_path
        assert path.startswith("fused") == (family in FUSED), path
        result = sampler.sample(PROMPT, num_samples=3, sampling_params={"max_tokens": 10, "temperature": 1.0, "seed": 1}).result()
        for seq in result.sequences:
            want = own_logprobs(reference, PROMPT + seq.tokens)[len(PROMPT) - 1:]
            torch.testing.assert_close(torch.tensor(seq.logprobs), want[: len(seq.tokens)], atol=2e-5, rtol=0)

        # one LoRA step changes the output; the trained sampler agrees with the trained trainer
        before = trainer_logprobs(trainer, group[:1])[0]
        trainer.forward_backward([sft_datum(group[0], prompt_len=len(PROMPT))]).result()
        trainer.optim_step(AdamParams(learning_rate=2e-2)).result()
        after = trainer_logprobs(trainer, group[:1])[0]
        assert (after - before).abs().max() > 1e-3
        trained = trainer.save_weights_and_get_sampling_client("step1")
        result = trained.sample(PROMPT, num_samples=2, sampling_params={"max_tokens": 8, "temperature": 1.0, "seed": 2}).result()
        scored = trainer_logprobs(trainer, [PROMPT + s.tokens for s in result.sequences])
        for seq, lp in zip(result.sequences, scored):
            torch.testing.assert_close(torch.tensor(seq.logprobs), lp[len(PROMPT) - 1:], atol=2e-5, rtol=0)
    finally:
        trainer.stop()


def test_a_sliding_window_shorter_than_the_context_leaves_the_lean_decode():
    from transformers import AutoModelForCausalLM

    from rlkit.backends.local.decode import fused_unsupported_reason
    from rlkit.backends.local.families import TINY_FAMILIES

    config = TINY_FAMILIES["mistral"](vocab_size=512)
    assert fused_unsupported_reason(AutoModelForCausalLM.from_config(config)) is None
    config.sliding_window = 8  # Mistral 7B v0.1 has a 4096-token window over a 32k context
    assert fused_unsupported_reason(AutoModelForCausalLM.from_config(config)) == "sliding-window attention"


def test_a_family_saved_to_a_directory_loads_by_path(tmp_path):
    tiny = load_model("tiny-qwen3")
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.model.config.model_type == "qwen3" and loaded.stop_token_ids == tiny.stop_token_ids
    torch.testing.assert_close(own_logprobs(loaded.model, PROMPT), own_logprobs(tiny.model, PROMPT), atol=0, rtol=0)


def test_softcapped_target_logprobs_match_autograd_in_value_and_gradient():
    torch.manual_seed(0)
    hidden = torch.randn(7, 16, requires_grad=True)
    weight, targets, temperature = torch.randn(50, 16) * 3, torch.randint(0, 50, (7,)), torch.rand(7) + 0.5
    got = softcapped_target_logprobs(hidden, weight, targets, temperature, softcap=5.0, chunk_rows=3)
    logits = torch.tanh(hidden @ weight.T / 5.0) * 5.0 / temperature[:, None]
    want = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(got, want)
    (g1,) = torch.autograd.grad(got.sum(), hidden)
    (g2,) = torch.autograd.grad(want.sum(), hidden)
    torch.testing.assert_close(g1, g2)
    assert logit_softcap(load_model("tiny-gemma2").model.config) == 30.0 and logit_softcap(load_model("tiny-gemma3").model.config) is None
