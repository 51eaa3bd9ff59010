"""The global RNG state (Python, NumPy, torch) as JSON-able data.

The loop scaffold owns it, explicitly (:class:`rlkit.scaffold.LoopSession`): on entering, it
seeds every global RNG from ``cfg.seed`` (:func:`seed_everything`); a checkpoint's
``loop_state`` carries :func:`capture_rng`'s value under ``"rng"``; a resumed run's
``LoopSession.restore`` puts it back with :func:`restore_rng`, so a killed and resumed run draws
the same numbers as one that never stopped. Nothing else in rlkit seeds or restores them.
"""

from __future__ import annotations

import base64
import random
from typing import Any, Dict, Mapping


def capture_rng() -> Dict[str, Any]:
    """The global Python, NumPy and torch RNG states, as JSON-able data."""
    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    import numpy as np
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    raw = base64.b64decode(state["torch"])
    torch.set_rng_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone())


def seed_everything(seed: int) -> None:
    """Seed the global Python, NumPy and torch RNGs (a fresh run starts from ``cfg.seed``)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
