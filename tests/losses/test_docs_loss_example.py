"""docs/losses.md's research-loss example, as printed: it builds from a config (its keywords
checked through its ``**kw``), computes, and returns the metrics the page says it logs."""

import re
import types
from pathlib import Path

import pytest
import torch

from rlkit.errors import ConfigError
from rlkit.imports import check_kwargs
from rlkit.types import Datum, ModelInput

DOC = Path(__file__).resolve().parents[2] / "docs" / "losses.md"


def example_module():
    text = DOC.read_text()
    source = re.search(r"```python\n(# my_losses.py.*?)```", text, re.S).group(1)
    module = types.ModuleType("my_losses")
    exec(compile(source, str(DOC), "exec"), module.__dict__)
    promised = set(re.findall(r"`train/([a-z_/]+:(?:mean|sum))`", text[text.index("# my_losses.py"):text.index("## Off-policy")]))
    return module, promised


def test_the_documented_loss_checks_its_keywords_and_logs_what_the_page_promises():
    module, promised = example_module()
    cls = module.AsymmetricPPO
    assert check_kwargs(cls, {"positive_clip_high": 1, "clip_high_threshold": 1.3}, "loss") == {
        "positive_clip_high": 1.0, "clip_high_threshold": 1.3}
    with pytest.raises(ConfigError, match="did you mean 'positive_clip_high'"):
        check_kwargs(cls, {"positve_clip_high": 1.3}, "loss")
    with pytest.raises(ConfigError, match="expected a float"):
        check_kwargs(cls, {"positive_clip_high": "abc"}, "loss")
    n = 4
    datum = Datum(model_input=ModelInput.from_ints([1, 2, 3, 4]), loss_fn_inputs={
        "target_tokens": [2, 3, 4, 0], "weights": [0.0, 1.0, 1.0, 1.0], "logprobs": [-1.0] * n, "advantages": [1.0] * n})
    loss, metrics = cls(positive_clip_high=1.3)([datum], [torch.tensor([-1.0, -0.5, -1.0, -2.0], requires_grad=True)])
    assert torch.isfinite(loss)
    assert promised and promised <= set(metrics), (promised, sorted(metrics))
