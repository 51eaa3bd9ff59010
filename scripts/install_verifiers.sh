#!/usr/bin/env bash
# verifiers beside the envs extra: its packages in a side folder, ./.venv/site-verifiers
# (bash scripts/install.sh dev calls this, and install.sh envs,verifiers).
# Why a side folder: verifiers 0.4.0 pins mcp==2.0.0 (and openai<3), while openenv 0.10.0 needs
# fastmcp 3.x, which needs mcp<2 — pip cannot put both in one environment (ResolutionImpossible). So
# .venv keeps openenv, textarena and openai 3.x, and the packages verifiers needs that .venv lacks, or has
# at another version (openai 2.x, mcp 2.0, ...), are installed with --no-deps into the side folder, at the
# versions pip resolves for verifiers against .venv. A process that puts the folder first on PYTHONPATH
# (PYTHONPATH=.venv/site-verifiers .venv/bin/rlkit train ...) runs verifiers with its own pins over .venv;
# tests/envs/test_verifiers_site.py runs rlkit's verifiers tests, and its openai-using tests on openai 2.x,
# that way. In an environment without the envs extra, `pip install 'rlkit[verifiers]'` is all you need.
# Set RLKIT_VERIFIERS to choose another verifiers requirement, RLKIT_VERIFIERS_SITE another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
site="${RLKIT_VERIFIERS_SITE:-.venv/site-verifiers}"
req="${RLKIT_VERIFIERS:-verifiers==0.4.0}"
py=.venv/bin/python
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
"$py" -m pip install -q --disable-pip-version-check --dry-run --report "$report" "$req"
pins="$("$py" - "$report" <<'PY'
import json
import sys

# what pip would install into .venv for verifiers: everything .venv lacks or has at a version verifiers refuses
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    if meta["name"].lower() not in ("torch", "rlkit"):  # never a second torch (the CPU wheel stays .venv's)
        print(f"{meta['name']}=={meta['version']}")
PY
)"
rm -rf "$site"
# shellcheck disable=SC2086
"$py" -m pip install -q --disable-pip-version-check --no-deps --target "$site" $pins
echo "verifiers installed in $(pwd)/$site ($(echo $pins | wc -w) packages): PYTHONPATH=$site .venv/bin/rlkit train ..."
