"""Each loss's identity is written once: the SDK enum names the same built-ins as the registry,
every backend's capabilities derive their built-ins from it, and the shipped loss configs repeat no
default differently from the class's own __init__."""

import inspect
from pathlib import Path

import yaml

from rlkit.config import import_string
from rlkit.losses.builtin import BUILTIN_LOSSES
from rlkit.losses.registry import LOSSES
from rlkit.types import LossFunction

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "loss"


def test_the_sdk_enum_and_the_registry_name_the_same_builtins():
    assert {f.value for f in LossFunction} == set(BUILTIN_LOSSES)
    assert all(LOSSES[name] is cls for name, (cls, _) in BUILTIN_LOSSES.items())
    assert all(name == cls.name for name, cls in LOSSES.items())


def test_every_engine_declares_the_registry_builtins():
    from rlkit.backends.local.clients import LOCAL_CAPABILITIES
    from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES
    from rlkit.backends.tinker.capabilities import tinker_capabilities

    want = {name: tuple(defaults) for name, (_, defaults) in BUILTIN_LOSSES.items()}
    for caps in (LOCAL_CAPABILITIES, SAGEMAKER_CAPABILITIES, tinker_capabilities()):
        assert dict(caps.builtin_losses) == want, caps.engine


def test_shipped_loss_configs_repeat_the_class_defaults():
    checked = 0
    for path in sorted(CONFIGS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        params = inspect.signature(import_string(spec["_target_"]).__init__).parameters
        for key, value in spec.items():
            if key in params and params[key].default is not inspect.Parameter.empty:
                assert value == params[key].default, (path.name, key, value, params[key].default)
                checked += 1
    assert checked >= 6
