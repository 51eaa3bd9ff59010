"""Re-evaluate the SFT and SFT+RL checkpoints with the per-problem-seed evaluation, 50 held-out problems."""
import json
import time
import rlkit
from rlkit.rl.eval import evaluate
from rlkit.rl.collect import RolloutPolicy
from rlkit.tasks import build_task

svc = rlkit.connect("local")
task = build_task({"name": "tools", "task": {"name": "arithmetic", "ops": ["*"], "low": 100, "high": 999, "num_train": 512,
                                             "num_test": 100, "num_shots": 0, "prefill": False}, "tools": ["calculator"], "max_tool_calls": 2})
probs = task.problems("test")[:50]
for label, run in (("sft", "sft0"), ("sft+rl", "rl0")):
    ck = json.loads(open(f"/tmp/meas/runs/{run}/checkpoints.jsonl").read().splitlines()[-1])["checkpoint"]
    tr = svc.create_training_client_from_state(ck)
    s = tr.save_weights_and_get_sampling_client()
    t0 = time.time()
    m = evaluate(s, task, probs, tr.get_tokenizer(), max_tokens=48, pass_k=4, seed=0, policy=RolloutPolicy(max_turns=3))
    print(label, json.dumps({k: round(v, 3) for k, v in m.items()}), round(time.time() - t0), flush=True)
    tr.stop()
svc.close()
