"""A user's loss in the project directory, as a new user writes it (``my_losses.py`` beside the
command, no PYTHONPATH): it imports, and every mistake in it or its config is one line, exit code 2,
before anything runs or is written, for a single run and for every job of a sweep."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import warm_rlkit

from rlkit.composition import compose
from rlkit.errors import ConfigError

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

MY_LOSSES = '''
from rlkit.losses import PPO


class AsymmetricPPO(PPO):
    name = "asymmetric_ppo"

    def __init__(self, positive_clip_high: float = 1.28, **kw):
        super().__init__(**kw)
        self.positive_clip_high = positive_clip_high
'''


@pytest.fixture
def project(tmp_path):
    (tmp_path / "my_losses.py").write_text(MY_LOSSES)
    return tmp_path


def rlkit_train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return warm_rlkit.run(["train", "recipe=arithmetic_grpo_smoke", *args], cwd=cwd, env=env, timeout=120)


def one_line_exit_2(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("rlkit: error: ") and "Traceback" not in out.stderr, out.stderr
    return out.stderr


def test_a_loss_in_the_working_directory_imports_without_pythonpath(project):
    out = rlkit_train(project, "loss._target_=my_losses.AsymmetricPPO", "+loss.positive_clip_high=1.3", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "_target_: my_losses.AsymmetricPPO" in out.stdout


@pytest.mark.parametrize("override, message", [
    ("+loss.positve_clip_high=1.3", "loss.positve_clip_high: not a parameter of AsymmetricPPO (accepts ['positive_clip_high', "
                                    "'clip_low_threshold', 'clip_high_threshold', 'dual_clip', 'correction']); did you mean "
                                    "'positive_clip_high'?"),
    ("+loss.positive_clip_high=abc", "loss.positive_clip_high='abc': expected a float (AsymmetricPPO's positive_clip_high)"),
])
def test_a_bad_loss_kwarg_is_one_line_before_anything_runs(project, override, message):
    err = one_line_exit_2(rlkit_train(project, "loss._target_=my_losses.AsymmetricPPO", override, f"run_dir={project / 'run'}"))
    assert message in err
    assert sorted(p.name for p in project.iterdir()) == ["my_losses.py"]  # no run directory, no outputs/


def test_every_job_of_a_sweep_over_loss_classes_is_checked_before_job_0(project):
    err = one_line_exit_2(rlkit_train(project, "-m", "loss._target_=my_losses.AsymmetricPPO,rlkit.losses.PPO",
                                      "+loss.positive_clip_high=1.3", f"run_dir={project / 'sweep'}"))
    assert "sweep job 1 of 2 (loss._target_=rlkit.losses.PPO): loss.positive_clip_high: not a parameter of PPO" in err
    assert not (project / "sweep").exists()


def test_composition_checks_task_and_loss_classes(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"cannot import module 'nowhere_losses' \(no nowhere_losses.py or nowhere_losses/ "
                                          r"in the working directory"):
        compose(["recipe=arithmetic_grpo_smoke", "loss._target_=nowhere_losses.Loss"])
    with pytest.raises(ConfigError, match=r"^train.task.opz: not a parameter of ArithmeticTask .*did you mean 'ops'\?$"):
        compose(["recipe=arithmetic_grpo_smoke", "+train.task.opz=[add]"])
    with pytest.raises(ConfigError, match=r"train.task.name='arithmetc': unknown task.*did you mean 'arithmetic'\?$"):
        compose(["recipe=arithmetic_grpo_smoke", "train.task.name=arithmetc"])


def test_a_run_that_fails_after_it_started_records_failed_in_result_json(monkeypatch, tmp_path):
    import rlkit.composition
    from rlkit.runs import Run
    from rlkit.sweep.job import run_job

    cfg = compose(["recipe=sft_gsm8k_smoke", f"run_dir={tmp_path / 'run'}"])

    def execute(cfg, run_dir, overrides, *, on_open):
        with Run.open(cfg, run_dir, overrides=overrides) as run:
            on_open(run)
            run.materialize()
            raise RuntimeError("the loss broke\nat step 0")

    monkeypatch.setattr(rlkit.composition, "execute", execute)
    with pytest.raises(RuntimeError):
        run_job(cfg, tmp_path / "run", ["recipe=sft_gsm8k_smoke"], job=None)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["status"] == "failed" and result["error"] == "RuntimeError: the loss broke at step 0"
