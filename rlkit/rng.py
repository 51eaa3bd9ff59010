"""The global RNG state (Python, NumPy, torch) as JSON-able data.

The loop scaffold owns it, explicitly (:class:`rlkit.scaffold.LoopSession`): on entering, it
seeds every global RNG from ``cfg.seed`` (:func:`seed_everything`); a checkpoint's
``loop_state`` carries :func:`capture_rng`'s value under ``"rng"``; a resumed run's
``LoopSession.restore`` puts it back with :func:`restore_rng`, so a killed and resumed run draws
the same numbers as one that never stopped. Nothing else in rlkit seeds or restores them.

**A run on a thread of a shared process** (:mod:`rlkit.thread_runs`: ``rlkit repro ... jobs=shared``,
``hydra/launcher=rlkit_shared``) calls :func:`own_rng` first: from then on these three functions
seed, capture and restore that thread's own Python, NumPy and torch generators (same values, same
JSON as the global ones would hold), so its checkpoints carry what it would write alone and no run
reseeds another's. rlkit draws from explicit generators only; user code drawing from the global
RNGs in such a run is not reproducible from its seed.
"""

from __future__ import annotations

import base64
import random
import threading
from typing import Any, Dict, Mapping

_thread = threading.local()  # .own: this thread's {"python", "numpy", "torch"} generators (own_rng)


def own_rng() -> None:
    """Give the calling thread RNG state of its own (see the module docstring), seeded 0 until
    :func:`seed_everything`."""
    _thread.own = _generators(0)


def _generators(seed: int) -> Dict[str, Any]:
    import numpy as np
    import torch

    return {"python": random.Random(seed), "numpy": np.random.RandomState(seed % 2**32),
            "torch": torch.Generator().manual_seed(seed)}


def _own() -> Any:
    return getattr(_thread, "own", None)


def capture_rng() -> Dict[str, Any]:
    """The global Python, NumPy and torch RNG states, as JSON-able data."""
    import numpy as np
    import torch

    own = _own()
    version, internal, gauss = (own["python"] if own else random).getstate()
    np_state = own["numpy"].get_state() if own else np.random.get_state()
    torch_state = own["torch"].get_state() if own else torch.get_rng_state()
    return {
        "python": [version, list(internal), gauss],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": base64.b64encode(torch_state.numpy().tobytes()).decode("ascii"),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    import numpy as np
    import torch

    own = _own()
    version, internal, gauss = state["python"]
    (own["python"] if own else random).setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    (own["numpy"] if own else np.random).set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    raw = torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8).clone()
    if own:
        own["torch"].set_state(raw)
    else:
        torch.set_rng_state(raw)


def seed_everything(seed: int) -> None:
    """Seed the global Python, NumPy and torch RNGs (a fresh run starts from ``cfg.seed``); on a
    thread with :func:`own_rng`, that thread's own generators."""
    import numpy as np
    import torch

    if _own() is not None:
        _thread.own = _generators(seed)
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
