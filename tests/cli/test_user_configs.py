"""A project's own configs: a working directory's ``configs/`` (recipe/, model/, ... groups) is found
and extends or replaces the shipped tree; ``--config-dir``/``-cd`` and ``--config-name``/``-cn``
work as in any Hydra app; ``rlkit --help`` lists the user's recipes beside the shipped ones,
marked. The console of a run keeps to rlkit's own lines unless ``verbose=true``."""

import os

import pytest
import yaml

from rlkit import cli
import warm_rlkit

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

RECIPE = """# @package _global_
# my project's SFT: the smoke recipe, one step
defaults:
  - sft_gsm8k_smoke
  - _self_
train:
  steps: 1
  generate:
    examples: 0
data:
  eval:
    limit: 2
"""


@pytest.fixture()
def project(tmp_path):
    root = tmp_path / "project"
    (root / "configs" / "recipe").mkdir(parents=True)
    (root / "configs" / "model").mkdir()
    (root / "configs" / "recipe" / "my_sft.yaml").write_text(RECIPE)
    # replaces the shipped model/tiny.yaml for this project only
    (root / "configs" / "model" / "tiny.yaml").write_text(
        "# the tiny model with a rank-2 adapter\nbase_model: tiny\nrank: 2\nalpha: 4\n"
    )
    (root / "configs" / "exp.yaml").write_text(
        "# a primary config of the project's own\ndefaults:\n  - config\n  - _self_\nseed: 7\n"
    )
    return root


def rlkit(*args, cwd, env=None):
    return warm_rlkit.run(args, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, timeout=180)


def test_the_working_directorys_configs_extend_and_replace_the_shipped_ones(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    cfg = cli.compose(["recipe=my_sft"])
    assert cfg.recipe == "my_sft" and cfg.train.steps == 1 and cfg.loop == "sft"
    assert cfg.model.base_model == "tiny" and cfg.model.rank == 2  # the project's model/tiny.yaml won
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "  my_sft " in out and "[./configs] my project's SFT: the smoke recipe, one step" in out
    assert out.index("my_sft") < out.index("arithmetic_grpo")  # the user's first
    assert "sft_gsm8k_smoke" in out and "model     gpt-oss-20b, qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct, smollm2-135m-instruct, tiny" in out
    assert cli.options("model")["tiny"].replaces_shipped
    monkeypatch.chdir(project.parent)  # elsewhere the shipped model/tiny.yaml is back
    assert cli.compose(["recipe=sft_gsm8k_smoke"]).model.rank == 4
    with pytest.raises(Exception, match="unknown recipe 'my_sft'"):
        cli.compose(["recipe=my_sft"])


def test_a_project_recipe_runs_by_name_and_with_config_dir(project, tmp_path):
    fresh_fonts = {"MPLCONFIGDIR": str(tmp_path / "mpl1")}  # matplotlib rebuilds its font cache and says so
    proc = rlkit("train", "recipe=my_sft", "run_dir=r", cwd=project, env=fresh_fonts)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load((project / "r" / "config.yaml").read_text())
    assert config["recipe"] == "my_sft" and config["model"]["rank"] == 2
    assert "fontManager" not in proc.stdout + proc.stderr  # hidden unless verbose=true
    assert "train end (1/1)" in proc.stdout

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = rlkit(
        "train",
        "--config-dir",
        str(project / "configs"),
        "recipe=my_sft",
        "run_dir=r2",
        "verbose=true",
        cwd=elsewhere,
        env={"MPLCONFIGDIR": str(tmp_path / "mpl2")},
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load((elsewhere / "r2" / "config.yaml").read_text())["recipe"] == "my_sft"
    assert "generated new fontManager" in proc.stdout + proc.stderr  # verbose=true shows libraries' notes
    listed = rlkit("train", "-cd", str(project / "configs"), "--help", cwd=elsewhere)
    assert (
        listed.returncode == 0
        and "my_sft" in listed.stdout
        and f"[{project / 'configs'}] my project's SFT" in listed.stdout
    )


def test_config_name_picks_a_primary_config_of_the_project(project):
    proc = rlkit("train", "-cn", "exp", "recipe=my_sft", "--cfg", "job", cwd=project)
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert job["seed"] == 7 and job["train"]["steps"] == 1
    proc = rlkit("train", "--config-name=nope", "recipe=my_sft", cwd=project)
    assert proc.returncode == 2 and proc.stderr.startswith("rlkit: error:") and proc.stderr.count("\n") == 1
    assert "nope" in proc.stderr
    proc = rlkit("train", "-cd", "no/such/dir", "recipe=my_sft", cwd=project)
    assert proc.returncode == 2 and proc.stderr == "rlkit: error: -cd no/such/dir: not a directory\n"
