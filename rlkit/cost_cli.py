"""``rlkit cost recipe=NAME [run=DIR] [prices]``: the command over :mod:`rlkit.cost` (it composes
the recipe's config, which :mod:`rlkit.cost` itself never does: a loop calls :func:`rlkit.cost.preview`
with the config it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from rlkit.composition import compose
from rlkit import cost
from rlkit.cost import PRICE_KEYS, actual, estimate, report
from rlkit.errors import ConfigError


def cost_command(argv: List[str]) -> int:
    """rlkit cost recipe=NAME [key=value ...] [run=DIR] [prefill_price=.. sampled_price=.. train_price=..]
    [gpu_hour_price=.. train_tok_s=.. sample_tok_s=..]"""
    if not argv or argv[0] in ("-h", "--help"):
        print(cost.__doc__)  # the formulas
        return 0
    prices: Dict[str, Optional[float]] = {k: None for k in PRICE_KEYS}
    run_dir = None
    overrides = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key in PRICE_KEYS:
            try:
                prices[key] = float(value)
            except ValueError:
                raise ConfigError(f"{key}={value!r} is not a number") from None
        elif key == "run":
            run_dir = Path(value)
        else:
            overrides.append(arg)
    if run_dir is not None and not any(o.startswith("recipe=") for o in overrides):
        import yaml

        saved = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else None
        if not saved:
            raise ConfigError(f"run={run_dir}: not an rlkit run directory")
        overrides = [f"recipe={saved['recipe']}", *_saved_overrides(run_dir), *overrides]
    est = estimate(compose(overrides))
    rows = [("estimate (upper bounds for sampled/trained)", est)]
    if run_dir is not None:
        rows.append((f"actual ({run_dir})", actual(run_dir)))
    report(rows, prices, est, with_judge=run_dir is not None)
    if prices["prefill_price"] is None:
        print("give prefill_price= sampled_price= train_price= (per 1M tokens) for a per-token cost, and gpu_hour_price= train_tok_s= sample_tok_s= for a GPU-hour comparison")
    return 0


def _saved_overrides(run_dir: Path) -> List[str]:
    import yaml

    path = Path(run_dir) / "overrides.yaml"
    saved = yaml.safe_load(path.read_text()) if path.is_file() else []
    return [o for o in (saved or []) if not o.startswith(("recipe=", "run_dir=", "resume="))]
