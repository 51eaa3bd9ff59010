#!/usr/bin/env bash
# The local engine on one GPU next to plain transformers + peft on the same GPU (issue 26 item 4),
# for random-weight models of Qwen2.5-1.5B's and Llama-3-8B's shapes (gpu_models.py; no download).
#
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh [OUT_DIR]    # default benchmarks/results/gpu/<UTC date>
#   bash benchmarks/gpu_check.sh --smoke [OUT_DIR]                   # CPU, tiny shapes: only proves the parts run
#
# Needs a Python with a CUDA build of torch and rlkit's dependencies (pip install -e . in it);
# runs from the repository root. Per model, each arm in its own process (benchmarks/gpu_bench.py):
# one GRPO step (8 prompts x 8 samples, <= 120 new tokens, PPO, LoRA r16) — seconds and peak GPU
# memory; decode tokens/s at batch 1, 64 and 256; training tokens/s and MFU against the GPU's bf16
# peak. Then the table (table.md) and the JSON per arm are written to OUT_DIR. Every command is
# capped so the whole check finishes within 8 minutes; a capped or failed command is reported, its
# row stays empty, and the check goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--smoke" ]; then
  OUT="${2:-${TMPDIR:-/tmp}/rlkit-gpu-check-smoke}"
  exec "$PY" benchmarks/gpu_bench.py --smoke "$OUT"
fi
OUT="${1:-benchmarks/results/gpu/$(date -u +%Y-%m-%d)}"
MODELS_DIR="${RLKIT_GPU_MODELS:-${TMPDIR:-/tmp}/rlkit-gpu-models}"
mkdir -p "$OUT"
"$PY" -c "import torch" 2>/dev/null || { echo "gpu_check.sh: $PY cannot import torch (set PYTHON to an interpreter with CUDA torch and rlkit's dependencies)"; exit 2; }
"$PY" - <<'PY' || exit 2
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check.sh: torch {torch.__version__} sees no CUDA device")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
PY
start=$(date +%s)
DEADLINE=$(( start + 470 ))  # 7 min 50 s: nothing starts that could not finish by then
run() {  # run LIMIT_SECONDS CMD...: capped at the deadline; report a failure or a timeout, never stop the check
  local limit=$1; shift
  local left=$(( DEADLINE - $(date +%s) ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then echo "!! skipped (deadline): $*"; return; fi
  echo "+ [${limit}s] $*"
  timeout "$limit" "$@"; local rc=$?
  [ $rc -eq 0 ] || echo "!! exit $rc (124 = over ${limit}s): $*"
}
echo "== writing random-weight models to $MODELS_DIR (once; reused)"
mapfile -t MODELS < <(timeout 150 "$PY" benchmarks/gpu_models.py "$MODELS_DIR" --device cuda)
[ ${#MODELS[@]} -eq 2 ] || { echo "gpu_check.sh: could not write the random-weight models"; exit 2; }
# per model: the arms' limits (seconds) and steps; the 8B model loads 16 GB twice
declare -A LIMIT=([qwen2.5-1.5b-shape]=75 [llama3-8b-shape]=120)
declare -A STEPS=([qwen2.5-1.5b-shape]=2 [llama3-8b-shape]=1)
for model in "${MODELS[@]}"; do
  name=$(basename "$model")
  for arm in rlkit hf; do
    echo; echo "== $name: $arm"
    run "${LIMIT[$name]:-90}" "$PY" benchmarks/gpu_bench.py --arm "$arm" --device cuda --model "$model" \
      --steps "${STEPS[$name]:-1}" --json "$OUT/$name-$arm.json"
  done
done
echo
"$PY" benchmarks/gpu_bench.py --table "$OUT"/*.json --out "$OUT/table.md"
echo; echo "gpu_check.sh: $(( $(date +%s) - start )) s; table and JSON in $OUT"
