"""Config composition and validation (in-process, no model loaded): typed schemas refuse a
misspelt key or a wrong type with the key's path; the CLI prints one line and exits 2."""

import sys
import types

import pytest
from omegaconf import OmegaConf

from rlkit import cli
from rlkit.config import LocalBackendConfig, LoopConfig, SFTConfig
from rlkit.errors import ConfigError

SMOKE = ["recipe=sft_gsm8k_smoke"]


def test_compose_recipe_with_groups_and_overrides():
    cfg = cli.compose(["recipe=sft_gsm8k", "model=tiny", "train.learning_rate=3e-3", "backend.precision=fp32"])
    assert cfg.recipe == "sft_gsm8k" and cfg.loop == "sft"
    assert OmegaConf.get_type(cfg.train) is SFTConfig
    assert OmegaConf.get_type(cfg.backend) is LocalBackendConfig
    assert cfg.model.base_model == "tiny" and cfg.model.rank == 4
    assert cfg.train.learning_rate == 3e-3 and cfg.backend.precision.value == "fp32"
    assert cfg.data.train.path == "gsm8k/train.jsonl" and cfg.data.eval.limit == 100
    assert cfg.loss._target_ == "rlkit.losses.CrossEntropy"
    assert cfg.logger.console and not cfg.logger.wandb
    default = cli.compose(["recipe=sft_gsm8k"])
    assert default.model.base_model == "smollm2-135m-instruct" and default.backend.precision.value == "auto"


def test_recipe_variant_composes_its_parent():
    cfg = cli.compose(SMOKE + ["logger=wandb"])
    assert cfg.model.base_model == "tiny" and cfg.train.steps == 4 and cfg.data.train.limit == 64
    assert cfg.train.format.transform == "rlkit.data:gsm8k_messages"  # inherited from sft_gsm8k
    assert cfg.logger.wandb


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lerning_rate=1", "unknown config key 'train.lerning_rate': Key 'lerning_rate' not in 'SFTConfig'"),
        ("train.lerning_rate=1", "not in 'SFTConfig'; did you mean 'learning_rate'?"),
        ("+train.lerning_rate=1", "not in 'SFTConfig'; did you mean 'learning_rate'?"),
        ("model.rnak=4", "unknown config key 'model.rnak': Key 'rnak' not in 'ModelConfig'; did you mean 'rank'?"),
        ("loss.dual_clip=3", "unknown config key 'loss.dual_clip': Key 'dual_clip' is not in struct; to add a new key, use "
                             "+loss.dual_clip=VALUE"),
        ("model=tinyy", "unknown model option 'tinyy' (did you mean 'tiny'?); available: gpt-oss-20b, qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct, smollm2-135m-instruct, tiny"),
        ("recipe=sft_gsm8k_smok", "unknown recipe 'sft_gsm8k_smok' (did you mean 'sft_gsm8k_smoke'?); available: "),
        ("train.format.max_lenght=3", "unknown config key 'train.format.max_lenght'"),
        ("lr=1", "unknown config key 'lr'"),
        ("+train.foo=1", "unknown config key 'train.foo'"),
        ("+bar=1", "unknown config key 'bar'"),
        ("train.steps=abc", "config key 'train.steps': Value 'abc' of type 'str' could not be converted to Integer"),
        ("train.learning_rate=fast", "config key 'train.learning_rate'"),
        ("backend.precision=fp16", "config key 'backend.precision': Invalid value 'fp16', expected one of [fp32, bf16, auto]"),
        ("train.lr_schedule=exp", "config key 'train.lr_schedule': Invalid value 'exp'"),
        ("model=huge", "unknown model option 'huge'; available: gpt-oss-20b, qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct, smollm2-135m-instruct, tiny"),
        ("backend=nowhere", "unknown backend option 'nowhere'"),
        ("data.train.path=/no/such/file.jsonl", "data file '/no/such/file.jsonl' not found"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(Exception) as info:
        cli.compose(SMOKE + [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_and_missing_recipe():
    with pytest.raises(ConfigError, match="unknown recipe 'nope'; available: .*sft_gsm8k"):
        cli.compose(["recipe=nope"])
    with pytest.raises(ConfigError, match="no recipe given"):
        cli.compose([])


def test_misspelt_key_in_a_recipe_file_names_the_file(tmp_path):
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "typo.yaml").write_text(
        "# @package _global_\ndefaults:\n  - sft_gsm8k_smoke\n  - _self_\ntrain:\n  warmup_stpes: 3\n"
    )
    with pytest.raises(ConfigError) as info:
        cli.compose(["recipe=typo", f"hydra.searchpath=[file://{tmp_path}]"])
    assert str(info.value) == ("unknown config key 'train.warmup_stpes' (in recipe/typo.yaml): Key 'warmup_stpes' not in "
                               "'SFTConfig'; did you mean 'warmup_steps'?")


def test_learning_rate_schedules():
    cosine = LoopConfig(learning_rate=1.0, warmup_steps=2, lr_schedule="cosine", min_lr_ratio=0.1)
    lrs = [cosine.learning_rate_at(s, 12) for s in range(12)]
    assert lrs[:2] == [0.5, 1.0] and lrs[2] == 1.0
    assert abs(lrs[-1] - 0.1) < 1e-12 and all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    linear = LoopConfig(learning_rate=2.0, lr_schedule="linear")
    assert [linear.learning_rate_at(s, 5) for s in range(5)] == [2.0, 1.5, 1.0, 0.5, 0.0]
    constant = LoopConfig(learning_rate=0.3, lr_schedule="constant", warmup_steps=3)
    assert [round(constant.learning_rate_at(s, 6), 6) for s in range(6)] == [0.1, 0.2, 0.3, 0.3, 0.3, 0.3]
    assert LoopConfig.due(0, 7, 10) is False and LoopConfig.due(0, 10, 10) and LoopConfig.due(5, 5, 10)


# -- the command line, in process -------------------------------------------------------------------


def test_help_lists_commands_and_recipes(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "sft_gsm8k" in out and "sft_gsm8k_smoke" in out and "model" in out


def test_unknown_command_is_one_line_exit_2(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err
    assert err == ("rlkit: error: unknown command 'trian'; available: " + ", ".join(cli.COMMANDS)
                   + " (see rlkit --help); did you mean 'train'?\n")


def test_train_config_error_is_one_line_exit_2(capsys):
    assert cli.main(["train", "recipe=sft_gsm8k_smoke", "train.lerning_rate=1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.lerning_rate" in err and "Traceback" not in err
    assert cli.main(["train", "-m", "recipe=sft_gsm8k_smoke", "seed=0,1", "resume=/tmp/x"]) == 2
    assert "resume= continues one run" in capsys.readouterr().err


def test_a_command_is_a_function_in_a_dict(capsys):
    @cli.command("hello", "say hello")
    def hello(argv):
        print("hello", *argv)
        if argv == ["bad"]:
            raise ConfigError("hello: 'bad' is not a name")
        return 0

    try:
        assert cli.main(["hello", "world"]) == 0
        assert capsys.readouterr().out == "hello world\n"
        assert cli.main(["hello", "bad"]) == 2
        assert capsys.readouterr().err == "rlkit: error: hello: 'bad' is not a name\n"
        assert "say hello" in cli.usage()
    finally:
        del cli.COMMANDS["hello"]


def test_a_new_loop_is_a_registry_entry_plus_a_recipe(tmp_path, monkeypatch):
    """No change to cli.py: register a loop, add a recipe on Hydra's search path, run it."""
    from rlkit import loops

    module = types.ModuleType("rlkit_test_echo_loop")

    def echo(cfg, run):
        from rlkit.scaffold import LoopSession

        with LoopSession(run) as session:  # the documented scaffold: it takes the run directory
            run.start(2)
            for step in range(2):
                session.end_step(step, {"train/loss": float(cfg.train.learning_rate) * (step + 1)})
            return run.finish()

    module.echo = echo
    monkeypatch.setitem(sys.modules, "rlkit_test_echo_loop", module)
    monkeypatch.setitem(loops.LOOPS, "echo", loops.LoopSpec("rlkit_test_echo_loop:echo", "rlkit.config:LoopConfig"))
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "echo.yaml").write_text(
        "# @package _global_\n# echoes its learning rate\ndefaults:\n  - /schema/train/echo@train\n  - override /model: tiny\n  - _self_\n"
        "loop: echo\ntrain:\n  learning_rate: 0.5\n"
    )
    cfg = cli.compose(["recipe=echo", f"hydra.searchpath=[file://{tmp_path}]", "logger.console=false"])
    assert OmegaConf.get_type(cfg.train) is LoopConfig
    result = cli.execute(cfg, tmp_path / "run")
    assert result["train/loss"] == 1.0
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2
    assert (tmp_path / "run" / "metrics.png").exists()
    with pytest.raises(ConfigError, match="loop 'sft' needs SFTConfig"):
        cli.compose(["recipe=echo", f"hydra.searchpath=[file://{tmp_path}]", "loop=sft"])


def test_train_help_lists_recipes_and_groups(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: rlkit train recipe=NAME") and "sft_gsm8k" in out and "model: gpt-oss-20b, qwen2.5-0.5b-instruct, qwen2.5-1.5b-instruct, smollm2-135m-instruct, tiny" in out


def test_console_script_and_module_entry_points(tmp_path):
    import shutil
    import subprocess
    from pathlib import Path

    script = Path(sys.executable).parent / "rlkit"
    command = [str(script)] if script.exists() else [shutil.which("rlkit") or "rlkit"]
    for argv in (command, [sys.executable, "-m", "rlkit"]):
        proc = subprocess.run([*argv, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "sft_gsm8k" in proc.stdout, proc.stderr
