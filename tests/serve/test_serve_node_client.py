"""The official ``openai`` npm package, from Node.js, against ``rlkit serve`` on the tiny model.

The package (pinned in ``tests/serve/node/package.json``) is installed from the npm registry into
``$RLKIT_CACHE/serve-node/<hash of package.json>`` the first time (a few seconds), then reused.
This test does not skip: without ``node``/``npm`` or the registry it fails and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"


def node_project() -> Path:
    """A directory holding check_client.mjs and an installed node_modules/openai."""
    from rlkit.backends.local.models import cache_dir

    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"'{tool}' is not on PATH: the Node.js client test needs Node.js >= 18 and npm (https://nodejs.org)")
    package = (NODE_DIR / "package.json").read_bytes()
    target = cache_dir() / "serve-node" / hashlib.sha1(package).hexdigest()[:12]
    target.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "check_client.mjs"):
        shutil.copyfile(NODE_DIR / name, target / name)
    if not (target / "node_modules" / "openai" / "package.json").is_file():
        proc = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error"],
            cwd=target, capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0:
            pytest.fail(
                "npm could not install the 'openai' package (is the npm registry reachable from this machine? "
                f"npm config get registry / HTTPS_PROXY): exit {proc.returncode}\n{proc.stderr[-2000:]}"
            )
    return target


def test_openai_npm_client_against_rlkit_serve(tiny_server, api_key):
    project = node_project()
    env = {**os.environ, "NODE_NO_WARNINGS": "1"}
    proc = subprocess.run(
        ["node", "check_client.mjs", tiny_server.base_url, api_key, "tiny"], cwd=project, capture_output=True, text=True, timeout=180, env=env
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"node printed no result (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert proc.returncode == 0 and result.get("ok"), f"node client check failed at: {result.get('failed')}\n{result}\n{proc.stderr[-2000:]}"
    assert result["bad_request"]["status"] == 400 and result["bad_request"]["param"] == "messages"
    assert result["auth"]["status"] == 401 and result["auth"]["code"] == "invalid_api_key"
    assert result["models"] == ["tiny"]
    assert len(result["n"]) == 2 and result["stream"]["chunks"] > 2
