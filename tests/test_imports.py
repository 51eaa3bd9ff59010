"""User code by dotted path (rlkit.imports): both spellings, the working directory and a config
dir's parent importable, one-line failures naming the module, the folders searched and the fix;
keyword arguments checked along the __init__ chain and coerced or refused."""

import sys
from typing import Optional

import pytest

from rlkit.config_search import extra_config_dirs
from rlkit.errors import ConfigError
from rlkit.imports import check_kwargs, check_target_spec, import_object
from rlkit.losses import PPO


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder that is the working directory but not on sys.path (as under `rlkit train`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    for name in [m for m in sys.modules if m.startswith("proj_")]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


def test_both_spellings_resolve_the_same_object():
    assert import_object("rlkit.losses.PPO") is import_object("rlkit.losses:PPO") is import_object("rlkit.losses.ppo:PPO") is PPO
    assert import_object("rlkit.losses.ppo.PPO.compute") is PPO.compute
    with pytest.raises(ConfigError, match=r"loss._target_='rlkit.losses.PPX': 'rlkit.losses' has no attribute 'PPX'; did you mean 'PPO'\?"):
        import_object("rlkit.losses.PPX", "loss._target_")
    with pytest.raises(ConfigError, match="expected 'package.module.Name'"):
        import_object("PPO", "loss._target_")


def test_the_working_directory_and_a_config_dirs_parent_are_importable(project):
    (project / "proj_losses.py").write_text("from rlkit.losses import PPO\nclass Mine(PPO):\n    pass\n")
    assert import_object("proj_losses.Mine").__name__ == "Mine"
    assert str(project) in sys.path  # appended: a project file never shadows an installed package
    other = project / "elsewhere"
    (other / "configs").mkdir(parents=True)
    (other / "proj_tasks.py").write_text("X = 1\n")
    with extra_config_dirs([other / "configs"]):
        assert import_object("proj_tasks:X") == 1


def test_import_failures_name_the_module_the_folders_and_the_fix(project):
    with pytest.raises(ConfigError) as missing:
        import_object("proj_nowhere.Loss", "loss._target_")
    assert str(missing.value).startswith("loss._target_='proj_nowhere.Loss': cannot import module 'proj_nowhere'")
    assert str(project) in str(missing.value) and "PYTHONPATH" in str(missing.value)
    (project / "proj_broken.py").write_text("import proj_dependency_not_installed\n")
    with pytest.raises(ConfigError, match=r"importing module 'proj_broken' failed: ModuleNotFoundError: No module named "
                                          r"'proj_dependency_not_installed' \(.*proj_broken.py:1\)"):
        import_object("proj_broken.Loss", "loss._target_")


class Base:
    def __init__(self, lr: float = 0.1, steps: int = 1, flag: bool = False, name: Optional[str] = None):
        self.lr, self.steps, self.flag, self.name = lr, steps, flag, name


class Forwards(Base):
    def __init__(self, extra=1.5, **kw):
        super().__init__(**kw)


class KeepsOptions(Base):
    def __init__(self, **options):
        self.options = options


def test_kwargs_are_checked_along_the_init_chain_and_coerced():
    assert check_kwargs(Forwards, {"extra": 2, "lr": 1, "steps": 3.0, "flag": "true", "name": 7}, "x") == {
        "extra": 2, "lr": 1.0, "steps": 3, "flag": True, "name": "7"}
    with pytest.raises(ConfigError, match=r"^x.lrr: not a parameter of Forwards \(accepts \['extra', 'lr', 'steps', 'flag', "
                                          r"'name'\]\); did you mean 'lr'\?$"):
        check_kwargs(Forwards, {"lrr": 1.0}, "x")
    with pytest.raises(ConfigError, match=r"^x.lr='abc': expected a float \(Base's lr\)$"):
        check_kwargs(Forwards, {"lr": "abc"}, "x")
    with pytest.raises(ConfigError, match=r"^x.extra='abc': expected a number \(Forwards's extra\)$"):
        check_kwargs(Forwards, {"extra": "abc"}, "x")  # unannotated: its default's type
    with pytest.raises(ConfigError, match=r"x.steps=2.5: expected an integer"):
        check_kwargs(Base, {"steps": 2.5}, "x")
    assert check_kwargs(KeepsOptions, {"anything": 1}, "x") == {"anything": 1}  # a **kw kept, not forwarded


def test_a_target_spec_is_checked_without_being_called():
    check_target_spec({"_target_": "rlkit.rewards.math.MathAnswerReward"}, "train.generate.reward")
    with pytest.raises(ConfigError, match=r"^train.generate.reward.timeout: not a parameter of MathAnswerReward"):
        check_target_spec({"_target_": "rlkit.rewards.math.MathAnswerReward", "timeout": 1}, "train.generate.reward")
