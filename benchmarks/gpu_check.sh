#!/usr/bin/env bash
# The local engine on one GPU next to plain transformers + peft on the same GPU (issue 26 item 4),
# for random-weight models of Qwen2.5-1.5B's and Llama-3-8B's shapes (gpu_models.py; no download).
#
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh [OUT_DIR]    # default benchmarks/results/gpu/<UTC date>
#   bash benchmarks/gpu_check.sh --smoke [OUT_DIR]                   # CPU, tiny shapes: only proves the parts run
#   bash benchmarks/gpu_check.sh --nproc N [OUT_DIR]                 # the engine on N GPUs (issue 42), below
#   bash benchmarks/gpu_check.sh --nproc N --smoke [OUT_DIR]         # the same on N CPU ranks (gloo), tiny model, LoRA only
#
# --nproc N: FSDP2 over N ranks under torchrun, one GPU each (NCCL), against one rank, for LoRA and
# full fine-tuning on the random-weight Qwen2.5-1.5B shape, bf16 (benchmarks/ranks_memory.py --compare):
# per rank the GPU memory its tensors hold after two training steps and its peak, the seconds of a
# step (each rank runs 1/N of the batch), and after one sample the sampler's whole copy. Written to
# OUT_DIR/ranks.md; capped at 8 minutes like the rest.
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
if [ "${1:-}" = "--nproc" ]; then
  NPROC="${2:?gpu_check.sh --nproc needs a number of ranks}"; shift 2
  case "$NPROC" in ''|*[!0-9]*) echo "gpu_check.sh: --nproc $NPROC: expected a whole number of ranks"; exit 2;; esac
  if [ "${1:-}" = "--smoke" ]; then  # CPU ranks (gloo), the tiny model: proves the parts run
    OUT="${2:-${TMPDIR:-/tmp}/rlkit-gpu-check-ranks-smoke}"; mkdir -p "$OUT"
    OMP_NUM_THREADS=1 timeout 470 "$PY" benchmarks/ranks_memory.py --compare --nproc "$NPROC" --model tiny --modes lora | tee "$OUT/ranks.md"
    exit "${PIPESTATUS[0]}"
  fi
  OUT="${1:-benchmarks/results/gpu/$(date -u +%Y-%m-%d)}"; mkdir -p "$OUT"
  MODELS_DIR="${RLKIT_GPU_MODELS:-${TMPDIR:-/tmp}/rlkit-gpu-models}"
  "$PY" - "$NPROC" <<'PY' || exit 2
import sys, torch
n = int(sys.argv[1])
if torch.cuda.device_count() < n:
    sys.exit(f"gpu_check.sh: --nproc {n} but torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s)")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {n} x {torch.cuda.get_device_name(0)}")
PY
  model=$(timeout 150 "$PY" benchmarks/gpu_models.py "$MODELS_DIR" --device cuda --only qwen2.5-1.5b-shape) \
    || { echo "gpu_check.sh: could not write the random-weight model"; exit 2; }
  echo "== $(basename "$model"): LoRA and full fine-tuning on 1 and $NPROC ranks (bf16)"
  timeout 470 "$PY" benchmarks/ranks_memory.py --compare --nproc "$NPROC" --model "$model" --device cuda --precision bf16 \
    | tee "$OUT/ranks.md"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || echo "!! exit $rc (124 = over 470 s): ranks_memory.py"
  echo "gpu_check.sh --nproc $NPROC: table in $OUT/ranks.md"
  exit "$rc"
fi
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
