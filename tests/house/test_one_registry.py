"""Each loss's identity is written once, on its class, and each backend's once, in its spec.

The shipped loss classes (``rlkit.losses.registry.LOSS_CLASSES``) are the one list: the built-ins,
the SDK enum, every backend's capabilities, Tinker's converters and server, the DPO loop's
variants and the shipped loss configs' keys and defaults are read off them. The proof is twofold:
each derived list equals what the classes say, and no module outside the losses spells a second
list (a literal collection naming two or more shipped losses, or two or more registered backends
outside ``rlkit/backends``)."""

import ast
from pathlib import Path

import yaml

from rlkit.losses.builtin import BUILTIN_LOSSES, LossFunction
from rlkit.losses.dpo import DPO
from rlkit.losses.registry import LOSS_CLASSES, LOSSES, config_defaults

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "loss"


def literal_lists(path: Path):
    """Every literal tuple/list/set, dict's keys and ``x in (...)`` of string constants in ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        yield node.lineno, {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def test_the_builtins_and_the_sdk_enum_are_read_off_the_classes():
    assert tuple(BUILTIN_LOSSES) == tuple(cls.name for cls in LOSS_CLASSES if cls.builtin == cls.name)
    assert [f.value for f in LossFunction] == list(BUILTIN_LOSSES) and LossFunction.PPO == "ppo"
    assert all(LOSSES[name] is cls for name, (cls, _) in BUILTIN_LOSSES.items())
    assert all(name == cls.name for name, cls in LOSSES.items())


def test_every_engine_and_the_tinker_bridges_derive_the_builtins():
    from rlkit.backends.local.clients import LOCAL_CAPABILITIES
    from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES
    from rlkit.backends.tinker.capabilities import tinker_capabilities
    from rlkit.backends.tinker.convert import RL_LOSSES
    from rlkit.backends.tinker.server.ops import SUPPORTED_LOSSES

    want = {name: tuple(defaults) for name, (_, defaults) in BUILTIN_LOSSES.items()}
    for caps in (LOCAL_CAPABILITIES, SAGEMAKER_CAPABILITIES, tinker_capabilities()):
        assert dict(caps.builtin_losses) == want, caps.engine
    assert SUPPORTED_LOSSES == tuple(BUILTIN_LOSSES)
    assert RL_LOSSES == ("importance_sampling", "ppo", "cispo")  # the built-ins taking advantages


def test_the_dpo_loops_variants_are_the_loss_classes():
    from rlkit.loops.dpo import DPOVariant

    assert [v.value for v in DPOVariant] == list(DPO.variants) == ["dpo", "ipo"]


def test_shipped_loss_configs_repeat_no_class_default():
    """A ``configs/loss/*.yaml`` composes its class's ``/schema/loss/<name>`` and writes no key the
    class defaults; composed, it carries exactly the class's defaults."""
    from omegaconf import OmegaConf

    from rlkit.composition import compose

    for path in sorted(CONFIGS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        assert "_target_" not in spec, path.name
        schema = next(d for d in spec["defaults"] if str(d).startswith("/schema/loss/"))
        cls = LOSSES[schema.split("/")[-1].split("@")[0]]
        assert not set(spec) & set(config_defaults(cls)), (path.name, set(spec) & set(config_defaults(cls)))
    loss = OmegaConf.to_container(compose(["recipe=gsm8k_grpo", "loss=ppo"]).loss)
    assert loss == {"_target_": "rlkit.losses.PPO", "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    loss = compose(["recipe=gsm8k_grpo", "loss=ppo", "loss.clip_high_threshold=1.28"]).loss
    assert loss.clip_high_threshold == 1.28


def test_no_module_spells_a_second_list_of_losses():
    names = set(LOSSES)
    found = [f"{p.relative_to(ROOT)}:{line} {sorted(vals & names)}"
             for p in sorted((ROOT / "rlkit").rglob("*.py")) for line, vals in literal_lists(p) if len(vals & names) >= 2]
    assert found == []


def test_no_module_outside_the_backends_spells_a_list_of_backends():
    from rlkit.backends import BACKENDS

    names = set(BACKENDS)
    found = [f"{p.relative_to(ROOT)}:{line} {sorted(vals & names)}"
             for p in sorted((ROOT / "rlkit").rglob("*.py")) if "backends" not in p.relative_to(ROOT).parts
             for line, vals in literal_lists(p) if len(vals & names) >= 2]
    assert found == []


def test_config_composition_and_conformance_read_the_backend_specs(monkeypatch):
    """The schemas Hydra stores, the engines ``rlkit conformance`` offers and the refusals of
    ``rlkit train``'s config check all come from :data:`rlkit.backends.BACKENDS`: give the local
    engine a fixed LoRA alpha and take Tinker's away, and the alpha check follows the capabilities."""
    import dataclasses

    import pytest

    from rlkit.backends import BACKENDS, BackendSpec
    from rlkit.composition import compose
    from rlkit.config import backend_schemas
    from rlkit.conformance.cli import engines, parser
    from rlkit.errors import ConfigError
    from rlkit.session import Capabilities

    assert {n: s.schema_class() for n, s in BACKENDS.items()} == backend_schemas()
    assert set(engines()) == set(BACKENDS) | {"vllm"}
    fixed = Capabilities(engine="local", builtin_losses={}, fixed_lora_alpha=16)
    monkeypatch.setitem(BACKENDS, "local", dataclasses.replace(BACKENDS["local"], capabilities=fixed))
    monkeypatch.setitem(BACKENDS, "tinker", dataclasses.replace(BACKENDS["tinker"], capabilities=Capabilities("tinker", {})))
    with pytest.raises(ConfigError, match="model.alpha=8: the local engine's LoRA scale is fixed at alpha 16"):
        compose(["recipe=sft_gsm8k_smoke", "model.alpha=8"])
    assert compose(["recipe=sft_gsm8k_smoke", "backend=tinker", "model.alpha=8"]).model.alpha == 8
    monkeypatch.setitem(BACKENDS, "mine", BackendSpec("mine", "Mine", connect="mypkg:connect", schema=None,
                                                      capabilities=Capabilities("mine", {})))
    assert parser().parse_args(["mine"]).engine == "mine"
