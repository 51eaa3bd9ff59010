"""Teachers that differ from the tiny student: another chat template (same vocabulary), or another
vocabulary altogether, saved as local model directories the local backend loads by path."""

from __future__ import annotations

from pathlib import Path

#: a non-ChatML template: "### User:" / "### Assistant:" headers, turns ended by <|endoftext|>
OTHER_TEMPLATE = (
    "{% for message in messages %}{{ '### ' + message['role'] | capitalize + ':\n' + message['content'] + '<|endoftext|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}"
)

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "What is 12 + 5? 12 + 5 = 17. The answer is 17.",
    "Reply with the sum only. Add the ones digits first, then the tens.",
    "You are a helpful assistant. system user assistant",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * = ?",
] * 20


def retemplated_tokenizer(template: str = OTHER_TEMPLATE):
    """The tiny tokenizer (same vocabulary) with another chat template."""
    from rlkit.backends.local.models import load_tokenizer

    tok = load_tokenizer("tiny")
    tok.chat_template = template
    return tok


def other_vocab_tokenizer(vocab_size: int = 300):
    """A byte-level BPE with a different vocabulary (trained here in milliseconds), ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    return tok


def lossy_tokenizer():
    """A word-level tokenizer that maps unknown words to [UNK]: it cannot reproduce arbitrary text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2, "user": 3, "assistant": 4, "hi": 5, "ok": 6}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", bos_token="<|im_start|>", eos_token="<|im_end|>")
    tok.chat_template = CHATML
    return tok


def save_teacher_model(directory: Path, tokenizer) -> str:
    """A 2-layer random Llama for ``tokenizer`` saved (with it) to ``directory``; returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = LlamaForCausalLM(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


class Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class FakeSampler:
    """A sampling client whose teacher logprob of token ``x`` is ``-(x % 7 + 1) / 10``; records calls."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def get_tokenizer(self):
        return self.tokenizer

    @staticmethod
    def value(token: int) -> float:
        return -((token % 7) + 1) / 10

    def compute_logprobs(self, tokens):
        tokens = list(tokens)
        self.calls.append(tokens)
        return Done([None] + [self.value(x) for x in tokens[1:]])
