"""Fixtures of the lm-evaluation-harness tests: a small random Llama saved as a Hugging Face model
directory (so lm-eval's own ``hf`` model and rlkit load the very same weights), lm-eval's task
catalog, and GSM8K built as ``rlkit eval`` builds it (rlkit's copy of the data, offline)."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval", reason="needs lm-evaluation-harness (pip install 'rlkit[eval]')")


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    """A 2-layer Llama with the tiny tokenizer and weights drawn wider than the tiny model's
    (std 0.1, not 0.02): its greedy text varies from token to token instead of repeating one, so
    identical generations mean something."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from rlkit.backends.local.models import TINY_TOKENIZER_DIR

    path = tmp_path_factory.mktemp("hf-llama")
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.1)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def catalog():
    from rlkit.harness.catalog import load_catalog

    return load_catalog()


@pytest.fixture()
def offline(monkeypatch):
    """No hub: ``datasets`` and ``huggingface_hub`` read only their caches (restored afterwards)."""
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
