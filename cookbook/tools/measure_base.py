"""Can SmolLM2-135M-Instruct multiply alone? Held-out accuracy of the base model, no tools, in the
arithmetic task's own best format (3 solved examples as chat turns + the "a op b =" prefill).

    python cookbook/tools/measure_base.py        # ~4 min on 2 CPU cores

Prints greedy accuracy, pass@4 and pass@1 at temperature 1 on 100 held-out problems for
3-digit x 3-digit products (the tool recipe's task), 2-digit products and 3-digit sums.
"""

import time

import rlkit
from rlkit.rl.eval import evaluate
from rlkit.tasks.arithmetic import ArithmeticTask

CASES = [("3-digit x 3-digit", ["*"], 100, 999), ("2-digit x 2-digit", ["*"], 10, 99), ("3-digit + 3-digit", ["+"], 100, 999)]


def main() -> None:
    started = time.perf_counter()
    service = rlkit.connect("local")
    sampler = service.create_sampling_client(base_model="smollm2-135m-instruct")
    tokenizer = sampler.get_tokenizer()
    try:
        for label, ops, low, high in CASES:
            task = ArithmeticTask(ops=ops, low=low, high=high, num_train=64, num_test=100, num_shots=3)
            m = evaluate(sampler, task, task.problems("test"), tokenizer, max_tokens=8, pass_k=4)
            print(f"{label}: greedy {m['eval/greedy_accuracy']:.2f}, pass@4 {m['eval/pass@4']:.2f}, "
                  f"pass@1 (T=1) {m['eval/pass@1_sampled']:.3f}  ({time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        service.close()


if __name__ == "__main__":
    main()
