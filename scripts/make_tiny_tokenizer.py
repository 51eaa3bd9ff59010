"""Build the tiny model's tokenizer shipped in ``rlkit/assets/tiny-tokenizer`` (run once; committed).

A byte-level BPE with 512 entries trained on the first 3,000 GSM8K training questions and answers
(``../shared/data/gsm8k/train.jsonl``) plus generated arithmetic, with ChatML special tokens and
the same chat template shape as SmolLM2. Deterministic: the same input gives the same file.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "gsm8k" / "train.jsonl"
OUT = ROOT / "rlkit" / "assets" / "tiny-tokenizer"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def corpus(path: Path) -> list[str]:
    texts = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i >= 3000:
                break
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    rng = random.Random(0)
    for _ in range(3000):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        texts.append(f"What is {a} + {b}? {a} + {b} = {a + b}")
    return texts


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(data), trainer=trainer)
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} ({tok.get_vocab_size()} tokens)")


if __name__ == "__main__":
    main()
