"""Random-weight model directories for GPU benchmarks (no download): the shapes of
Qwen2.5-1.5B and Llama-3-8B (the default; also SmolLM2-135M and Qwen2-1.5B with ``--only``), with the
tiny test tokenizer shipped in rlkit.

    python benchmarks/gpu_models.py DIR [--device cuda]   # prints one directory per line

Each directory is written once (``config.json`` + bf16 ``model.safetensors`` + tokenizer) and
reused. The tokenizer only turns the benchmarks' text into token ids (all below the models'
vocabularies); with random weights the sampled text means nothing, so lengths are fixed by
``max_tokens`` (and the stop tokens the random model happens to emit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SHAPES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct config.json
    "smollm2-135m-shape": dict(
        arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    # Qwen/Qwen2-1.5B config.json (max_position_embeddings cut from 131072: nothing here is longer)
    "qwen2-1.5b-shape": dict(
        arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    # Qwen/Qwen2.5-1.5B-Instruct config.json (the same architecture as Qwen2-1.5B; context cut from 32768)
    "qwen2.5-1.5b-shape": dict(
        arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=8192, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
    # meta-llama/Meta-Llama-3-8B config.json
    "llama3-8b-shape": dict(
        arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
}
#: what ``gpu_check.sh`` runs (issue 26): Qwen2.5-1.5B's and Llama-3-8B's shapes
DEFAULT = ["qwen2.5-1.5b-shape", "llama3-8b-shape"]


def build(root: Path, name: str, device: str) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from rlkit.backends.local.models import load_tokenizer

    target = root / name
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target
    spec = dict(SHAPES[name])
    arch = spec.pop("arch")
    tokenizer = load_tokenizer("tiny")
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(**spec, **ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config)
    model = model.to(torch.bfloat16)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters written to {target}", file=sys.stderr)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--device", default="cuda", help="where to initialise the weights (fast on a GPU)")
    parser.add_argument("--only", choices=sorted(SHAPES), action="append")
    args = parser.parse_args()
    for name in args.only or DEFAULT:
        print(build(Path(args.root), name, args.device))


if __name__ == "__main__":
    main()
