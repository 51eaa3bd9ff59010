#!/usr/bin/env bash
# The local engine on one GPU, next to plain transformers/peft on the same GPU (issue 18), for two
# random-weight models (no download): SmolLM2-135M's shape and Qwen2-1.5B's shape.
#
#   PYTHON=/path/to/python bash benchmarks/gpu_check.sh [OUT_DIR]
#
# Needs a Python with a CUDA build of torch and rlkit's dependencies (pip install -e . in it);
# runs from the repository root. For each model: benchmarks/session_throughput.py --quick
# --device cuda (training step, group sampling, batch-1 decode, peak memory, mismatch; tokens/s and
# the fraction of the GPU's matmul peaks) and benchmarks/rl_step_vs_hf.py (one GRPO step vs HF
# generate + PEFT: seconds, tokens/s, fraction of the bf16 peak, peak memory). Each command is
# capped so the whole check stays well under ten minutes; a capped or failed command is reported
# and the check goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${1:-${TMPDIR:-/tmp}/rlkit-gpu-check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PY" -c "import torch" 2>/dev/null || { echo "gpu_check.sh: $PY cannot import torch (set PYTHON to an interpreter with CUDA torch and rlkit's dependencies)"; exit 2; }
"$PY" - <<'PY' || exit 2
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check.sh: torch {torch.__version__} sees no CUDA device")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
PY
start=$(date +%s)
run() {  # run LIMIT_SECONDS CMD...: report a failure or a timeout, never stop the check
  local limit=$1; shift
  echo "+ $*"
  timeout "$limit" "$@"; local rc=$?
  [ $rc -eq 0 ] || echo "!! exit $rc (124 = over ${limit}s): $*"
}
mapfile -t MODELS < <(timeout 120 "$PY" benchmarks/gpu_models.py "$OUT/models" --device cuda)
[ ${#MODELS[@]} -eq 2 ] || { echo "gpu_check.sh: could not write the random-weight models"; exit 2; }
for model in "${MODELS[@]}"; do
  name=$(basename "$model")
  echo; echo "== $name: session throughput (rlkit vs transformers/peft, same GPU)"
  run 180 "$PY" benchmarks/session_throughput.py --quick --device cuda --model "$model" --json "$OUT/$name-throughput.json"
  echo; echo "== $name: one GRPO step (rlkit vs HF generate + PEFT, same GPU)"
  run 100 "$PY" benchmarks/rl_step_vs_hf.py --device cuda --model "$model" --steps 2
done
echo; echo "gpu_check.sh: $(( $(date +%s) - start )) s; JSON in $OUT"
