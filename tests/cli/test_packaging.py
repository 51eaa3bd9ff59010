"""The config tree lives in the repository's top-level ``configs/`` and ships inside the wheel as
``rlkit/configs``: a wheel built from this checkout holds every YAML file, and rlkit installed from
it (non-editable, run from another directory) finds and composes them. A source checkout or an
editable install (what CI's ``pip install -e`` and every other CLI test use) reads ``configs/``
in place."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import rlkit
from rlkit.config_search import shipped_config_dir
import pytest

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

ROOT = Path(rlkit.__file__).resolve().parent.parent


def test_checkout_reads_the_top_level_configs():
    assert shipped_config_dir() == ROOT / "configs"
    assert (ROOT / "configs" / "config.yaml").is_file() and (ROOT / "configs" / "recipe").is_dir()
    # new YAML files go to configs/: a file left under rlkit/configs would be silently ignored
    stray = (
        sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rlkit" / "configs").rglob("*.yaml"))
        if (ROOT / "rlkit" / "configs").exists()
        else []
    )
    assert stray == [], f"move these to the top-level configs/: {stray}"


def test_the_wheel_ships_the_config_tree_and_an_install_from_it_finds_it(tmp_path):
    source = tmp_path / "src"  # build from a copy: setuptools writes build/ and *.egg-info beside the sources
    _mkdir(source)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "rlkit", source / "rlkit", ignore=ignore)
    shutil.copytree(ROOT / "configs", source / "configs", ignore=ignore)
    shutil.copytree(ROOT / "hydra_plugins", source / "hydra_plugins", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("rlkit-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"rlkit/configs/{p.relative_to(ROOT / 'configs')}" for p in (ROOT / "configs").rglob("*.yaml")}
    assert len(expected) > 20 and "rlkit/configs/config.yaml" in expected
    assert expected <= names, sorted(expected - names)
    assert "rlkit/cli.py" in names and "rlkit/assets/tiny-tokenizer/tokenizer.json" in names
    # the launcher plugin, in Hydra's namespace package (hydra_plugins/ itself stays a namespace)
    assert "hydra_plugins/rlkit_shared_launcher/rlkit_shared_launcher.py" in names
    assert "hydra_plugins/__init__.py" not in names

    target = tmp_path / "site"
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert installed.returncode == 0, installed.stderr
    elsewhere = _mkdir(tmp_path / "elsewhere")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)}
    probe = "import rlkit.config_search as c, rlkit; print(rlkit.__file__); print(c.shipped_config_dir())"
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert where.returncode == 0, where.stderr
    module, configs = where.stdout.split()
    assert Path(module).is_relative_to(target) and Path(configs) == target / "rlkit" / "configs"
    job = subprocess.run(
        # hydra/launcher=rlkit_shared composes only if Hydra found the plugin in the installed wheel
        [sys.executable, "-m", "rlkit", "train", "recipe=sft_gsm8k_smoke", "hydra/launcher=rlkit_shared", "--cfg", "job"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 0, job.stderr
    assert "loop: sft" in job.stdout and "base_model: tiny" in job.stdout


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
