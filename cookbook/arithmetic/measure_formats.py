"""Which prompt format gives SmolLM2-135M-Instruct something to learn from on 2-digit arithmetic?

    python cookbook/arithmetic/measure_formats.py [--problems 30] [--ops + - *]

For each operation and format it samples 8 completions per problem at temperature 1 (seed 1) and
one greedy completion, scores the first integer of each, and prints base pass@1, the fraction of
8-sample groups with reward variance (the only groups that give GRPO a gradient) and greedy
accuracy. Formats:

- ``plain``:    the question as the user turn ("What is 17 + 25?"), 24 new tokens;
- ``prefill``:  the same, with the assistant turn prefilled with "17 + 25 =", 8 new tokens;
- ``fewshot``:  3 solved examples as earlier chat turns, then the question, prefilled, 6 new tokens
  (what ``rlkit.tasks.arithmetic`` uses).
"""

from __future__ import annotations

import argparse
import random
import re

import rlkit
from rlkit.chat import prompt_tokens

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def first_int(text):
    m = re.search(r"-?\d+", text.replace(",", ""))
    return int(m.group()) if m else None


def messages(fmt, a, op, b, shots):
    turns = []
    if fmt == "fewshot":
        for x, y in shots:
            turns += [{"role": "user", "content": f"What is {x} {op} {y}?"}, {"role": "assistant", "content": f"{x} {op} {y} = {OPS[op](x, y)}"}]
    turns.append({"role": "user", "content": f"What is {a} {op} {b}?"})
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=30)
    parser.add_argument("--ops", nargs="+", default=["+", "-", "*"])
    args = parser.parse_args()
    svc = rlkit.connect("local")
    sc = svc.create_sampling_client(base_model="smollm2-135m-instruct")
    tok = sc.get_tokenizer()
    shot_rng = random.Random(99)
    print("| op | format | pass@1 (T=1) | groups with variance | greedy accuracy |")
    print("|---|---|---|---|---|")
    for op in args.ops:
        rng = random.Random(0)
        probs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(args.problems)]
        shots = [(shot_rng.randint(10, 99), shot_rng.randint(10, 99)) for _ in range(3)]
        for fmt, max_tokens in (("plain", 24), ("prefill", 8), ("fewshot", 6)):
            sampled, greedy = [], []
            for a, b in probs:
                p = prompt_tokens(tok, messages(fmt, a, op, b, shots), prefill="" if fmt == "plain" else f"{a} {op} {b} =")
                sampled.append(sc.sample(p, num_samples=8, sampling_params=rlkit.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=1)))
                greedy.append(sc.sample(p, sampling_params=rlkit.SamplingParams(max_tokens=max_tokens, temperature=0.0)))
            correct = [[first_int(tok.decode(s.tokens, skip_special_tokens=True)) == OPS[op](a, b) for s in f.result().sequences] for f, (a, b) in zip(sampled, probs)]
            greedy_ok = [first_int(tok.decode(f.result().sequences[0].tokens, skip_special_tokens=True)) == OPS[op](a, b) for f, (a, b) in zip(greedy, probs)]
            pass1 = sum(map(sum, correct)) / (8 * len(probs))
            variance = sum(0 < sum(c) < 8 for c in correct) / len(probs)
            print(f"| {op} | {fmt} | {pass1:.3f} | {variance:.2f} | {sum(greedy_ok) / len(probs):.2f} |", flush=True)
    svc.close()


if __name__ == "__main__":
    main()
