"""Sweeps checked before they start (in process, no model loaded): the basic sweeper's jobs are all
composed up front; a sampling sweeper (the real Optuna plugin) gets its search space untouched,
with each value checked; bad sweep input is one line, exit code 2, no traceback, nothing written;
the objective and its direction come from the loop unless the config says otherwise."""

import math

import pytest

from rlkit import cli
from rlkit.composition import compose, compose_with_hydra
from rlkit.errors import ConfigError
from rlkit.sweep.objective import Objective, failed_value, objective_of, outcome
from rlkit.sweep.plan import BASIC_SWEEPER, plan_sweep

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

SMOKE = ["recipe=sft_gsm8k_smoke"]


def plan(*overrides):
    return plan_sweep(list(overrides), compose_with_hydra, compose, lambda group: cli.group_options(group))


def test_basic_sweep_is_expanded_and_every_job_checked(tmp_path):
    p = plan(*SMOKE, "train.learning_rate=1e-3,3e-3", "seed=range(0,2)", f"run_dir={tmp_path / 'sw'}")
    assert p.sweeper == BASIC_SWEEPER and not p.owns_search_space
    assert len(p.jobs) == 4 and {tuple(j[1:3]) for j in p.jobs} == {
        ("train.learning_rate=0.001", "seed=0"),
        ("train.learning_rate=0.001", "seed=1"),
        ("train.learning_rate=0.003", "seed=0"),
        ("train.learning_rate=0.003", "seed=1"),
    }
    assert p.sweep_dir == (tmp_path / "sw").resolve()
    assert p.overrides[-1] == f"hydra.sweep.dir='{p.sweep_dir}'"  # pinned for every launcher's workers
    assert p.objective == Objective("eval/nll", "minimize")
    with pytest.raises(ConfigError, match="unknown config key 'train.stepz'"):
        plan(*SMOKE, "seed=0,1", "train.stepz=1")
    with pytest.raises(ConfigError, match="config key 'backend.precision': Invalid value 'fp16'"):
        plan(*SMOKE, "backend.precision=fp32,fp16")  # the second job is refused before the first runs
    assert not (tmp_path / "sw").exists()


def test_a_sampling_sweeper_gets_its_search_space_untouched():
    given = [
        *SMOKE,
        "hydra/sweeper=optuna",
        "train.learning_rate=tag(log, interval(1e-4, 1e-2))",
        "model.rank=choice(2,4)",
    ]
    p = plan(*given)
    assert p.sweeper.endswith("OptunaSweeper") and p.owns_search_space and p.jobs is None
    assert p.overrides[: len(given)] == given  # nothing expanded or rewritten
    assert "hydra.sweeper.direction=minimize" in p.overrides  # eval/nll, SFT's held-out metric
    rl = plan("recipe=arithmetic_grpo_smoke", "hydra/sweeper=optuna", "train.learning_rate=interval(1e-4,1e-2)")
    assert (
        rl.objective == Objective("eval/greedy_accuracy", "maximize")
        and "hydra.sweeper.direction=maximize" in rl.overrides
    )
    # the sweeper's own direction given explicitly decides; the jobs are told so (their failed value)
    mine = plan(
        *SMOKE, "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "train.learning_rate=interval(1e-4,1e-2)"
    )
    assert mine.objective == Objective("eval/nll", "maximize") and "sweep.direction=maximize" in mine.overrides
    with pytest.raises(ConfigError, match="contradicts sweep.direction=minimize"):
        plan(
            *SMOKE,
            "hydra/sweeper=optuna",
            "hydra.sweeper.direction=maximize",
            "sweep.direction=minimize",
            "seed=choice(0,1)",
        )
    # every choice value and both ends of an interval are checked before the first trial
    with pytest.raises(ConfigError, match="Invalid value 'fp16'"):
        plan(*SMOKE, "hydra/sweeper=optuna", "backend.precision=choice(fp32,fp16)")
    with pytest.raises(ConfigError, match="config key 'train.steps'"):
        plan(*SMOKE, "hydra/sweeper=optuna", "train.steps=interval(1.5,3.5)")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train.learning_rate=interval(0.1"],
            "malformed override 'train.learning_rate=interval(0.1': no viable alternative",
        ),
        (
            ["hydra/sweeper=optuna", "train.learning_rate=interval(a,0.2)"],
            "mismatch type argument start: str is incompatible",
        ),
        (
            ["train.learning_rate=interval(1e-4,1e-2)"],
            "the basic sweeper runs lists, range() and choice() only; "
            "interval() needs a sweeper that samples, e.g. hydra/sweeper=optuna",
        ),
        (
            ["hydra/sweeper=nevergrad", "seed=0,1"],
            "hydra/sweeper=nevergrad needs a Hydra plugin that is not installed: pip install hydra-nevergrad-sweeper",
        ),
        (
            ["hydra/launcher=ray", "seed=0,1"],
            "hydra/launcher=ray needs a Hydra plugin that is not installed: pip install hydra-ray-launcher",
        ),
        (
            ["hydra/sweeper=grid_search", "seed=0,1"],
            "unknown hydra/sweeper option 'grid_search'; available: basic, optuna",
        ),
        (
            ["hydra/launcher=cluster", "seed=0,1"],
            "unknown hydra/launcher option 'cluster'; available: basic, joblib, rlkit_shared, submitit_local, submitit_slurm",
        ),
        (["seed=0,one"], "config key 'seed': Value 'one' of type 'str' could not be converted to Integer"),
    ],
)
def test_bad_sweeps_are_one_line_exit_2_and_write_nothing(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "-m", *SMOKE, *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlkit: error: ") and "Traceback" not in err
    assert message in err, err
    assert list(tmp_path.iterdir()) == []


def test_unknown_train_option_is_one_line(capsys):
    assert cli.main(["train", "--config-dri", "x", *SMOKE]) == 2
    assert (
        capsys.readouterr().err
        == "rlkit: error: unknown option '--config-dri' for 'rlkit train' (see rlkit train --help)\n"
    )


def test_objectives_and_failed_values():
    sft = compose(SMOKE)
    assert objective_of(sft) == Objective("eval/nll", "minimize")
    named = compose([*SMOKE, "sweep.objective=eval/accuracy"])
    assert objective_of(named) == Objective("eval/accuracy", "maximize")  # read from its name
    assert objective_of(compose([*SMOKE, "sweep.objective=train/loss"])) == Objective("train/loss", "minimize")
    assert (
        objective_of(compose([*SMOKE, "sweep.objective=eval/accuracy", "sweep.direction=minimize"])).direction
        == "minimize"
    )
    assert objective_of(compose(["recipe=dpo_gsm8k_smoke"])) == Objective("eval/loss", "minimize")
    assert failed_value(sft, objective_of(sft)) == math.inf
    assert failed_value(named, objective_of(named)) == -math.inf
    assert failed_value(compose([*SMOKE, "sweep.failed_value=1e6"]), objective_of(sft)) == 1e6
    nll = Objective("eval/nll", "minimize")
    assert outcome(nll, {"eval/nll": 2.5}) == {"status": "completed", "objective": 2.5, "error": None}
    assert outcome(nll, {"eval/nll": float("nan")})["status"] == "diverged"
    assert outcome(nll, {"eval/nll": 1e308})["status"] == "diverged"  # how metrics.jsonl stores +inf
    missing = outcome(nll, {"train/nll": 2.0})
    assert (
        missing["status"] == "failed"
        and "objective 'eval/nll' was never logged (logged: train/nll)" in missing["error"]
    )
