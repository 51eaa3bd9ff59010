"""Memory per rank on N ranks: a rank holds its shard of the base, not the whole loaded copy.

**The rule.** In one process the runtime of a base model loads it once and every consumer shares
those tensors: the sampler (:class:`~.sampler.Sampler`, built with the runtime) and each training
session (:func:`~.models.share_base`). On N ranks (``torchrun``, ``WORLD_SIZE`` > 1) each training
engine ``fully_shard``-s its decoder layers, which copies this rank's 1/N of each weight; so that
the whole loaded copy does not stay alive beside the shards:

- the runtime :meth:`~.models.LoadedModel.release`-s its loaded weights once a session's engine is
  built (:func:`after_engine`): the engine keeps its shard of each decoder layer and the replicated
  embeddings and norm (plus its adapter and optimizer state, or in full fine-tuning its own
  weights, sharded the same way);
- the sampler is built at its first use, not with the runtime (:class:`LazySampler`): a run that
  never samples (SFT, DPO) never holds the whole base again, about half of it per rank with 2 ranks.

**Where the sampler's full weights come from.** The sampler decodes with the whole base, so on
its first use — a ``sample``/``compute_logprobs`` job reaching the sampler thread — the runtime
loads the base again with the loader that loaded it (:attr:`.models.LoadedModel.model`: the same
name, dtype and device, so the same bits; the base is frozen, never written). Not by gathering the
shards: a gather is a collective every rank must enter in the same order, and the sampler thread
runs beside the training thread (whose ``forward_backward`` issues the layers' all-gathers), so
it must never issue one; a reload issues none, on any thread, in any order. The adapter or full
fine-tuning weights a sampler merges are gathered where they always were, on the training
thread in the session's operation order (``save_weights_and_get_sampling_client``,
``save_weights_for_sampler``: :meth:`~.engine.TrainingEngine.adapter_snapshot`). The cost, said
plainly: a run that samples holds one whole copy of the base for its sampler from its first sample
on (as verl's FSDP trainer with a Hugging Face rollout does), beside the training shards; a reload
reads the model's files again once (SmolLM2 from the cache: well under a second). A later session
on the same base reloads the base for its engine to shard, then lets it go again.

One process (no ``torchrun``) is exactly as before: the sampler is built with the runtime over the
same tensors as every session, nothing is released or loaded twice.
"""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any, Dict, Optional

import torch

from rlkit.backends.local import distributed
from rlkit.backends.local.models import LoadedModel
from rlkit.backends.local.sampler import Sampler


class LazySampler:
    """The runtime's :class:`~.sampler.Sampler` on N ranks, built from the runtime's
    :class:`~.models.LoadedModel` at its first use (any attribute but :attr:`vocab_size` and
    :attr:`max_positions`, which the model's config answers). Built on whichever thread first asks
    — the sampler thread, for a sample — under a lock; building issues no collective."""

    def __init__(self, loaded: LoadedModel, precision: str):
        self._loaded = loaded
        self._precision = precision
        self._sampler: Optional[Sampler] = None
        self._lock = threading.Lock()
        self.vocab_size = loaded.vocab_size
        self.max_positions = loaded.max_positions

    @property
    def built(self) -> bool:
        """Whether the sampler (and with it a whole copy of the base) exists yet."""
        return self._sampler is not None

    def get(self) -> Sampler:
        """The sampler, built now if it is not yet."""
        with self._lock:
            if self._sampler is None:
                loaded = self._loaded
                self._sampler = Sampler(loaded.model, loaded.tokenizer, loaded.stop_token_ids, precision=self._precision)
            return self._sampler

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not built-in state: never build for a private name (copy, pickle probes)
            raise AttributeError(name)
        return getattr(self.get(), name)


def sampler_for(loaded: LoadedModel, precision: str) -> Any:
    """The sampler of a runtime: a :class:`~.sampler.Sampler` over ``loaded``'s tensors in one
    process; on N ranks a :class:`LazySampler` (see the module docstring)."""
    if distributed.world_size() > 1:
        return LazySampler(loaded, precision)
    return Sampler(loaded.model, loaded.tokenizer, loaded.stop_token_ids, precision=precision)


def after_engine(loaded: LoadedModel, engine: Any) -> None:
    """Once ``engine`` is built over ``loaded``'s weights: on N ranks (the engine has sharded its
    decoder layers) the runtime stops holding the whole loaded copy; in one process nothing changes."""
    if engine.world_size > 1:
        loaded.release()


def held_tensor_bytes() -> Dict[str, int]:
    """What this process holds in tensors, counted by storage (not RSS): ``{"bytes": ...,
    "storages": ...}`` over every distinct storage of a tensor the garbage collector tracks —
    parameters, buffers, optimizer state, caches, a sharded parameter by its local shard — on any
    device but ``meta``; a storage several tensors view counts once."""
    gc.collect()
    seen: Dict[Any, int] = {}
    with warnings.catch_warnings():  # isinstance on some modules' lazy attributes warns of their deprecation
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        t = distributed.local(obj)
        if t.device.type == "meta":
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without storage of its own
            continue
        if storage.data_ptr():
            seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return {"bytes": sum(seen.values()), "storages": len(seen)}
