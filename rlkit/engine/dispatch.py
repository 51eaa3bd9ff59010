"""How the front door routes a loss (DESIGN §2b, §3): one function, :func:`dispatch`, for every
engine's ``forward_backward`` / ``forward``.

The call's loss was built and validated once (:meth:`~rlkit.engine.clients.TrainingClientBase._batch`);
the engine receives that object, or the built-in object it runs as:

- **native built-in** — a built-in named by the call that the engine declares (with the call's
  ``loss_fn_config`` keys) and computes on this batch (``_native_batch_ok``); or, on an engine that
  takes built-ins only, a :class:`~rlkit.losses.Loss` object that *is* a declared built-in
  (:meth:`Loss.native_call`, on the batch :meth:`Loss.native_data` rewrites). The engine reads the
  built-in's name and config off the object (:func:`~rlkit.losses.builtin.builtin_call`);
- **native object** — any Loss object on an engine with ``native_custom_losses`` (the local
  engine differentiates it itself, in one pass);
- **linearised** — anything else: a ``forward`` for the trainer's logprobs, the loss and its
  gradient on the client, then ``forward_backward("cross_entropy", weights=-dL/dlogp)``
  (:func:`rlkit.losses.execute.linearised_backward`), so every loss runs on every engine.

The import direction is engine -> losses: the front door builds and validates losses and hands the
linearised ones to :mod:`rlkit.losses.execute`, which drives a trainer through its public methods
only and imports nothing of :mod:`rlkit.engine`.
"""

from __future__ import annotations

from typing import Any, List

from rlkit.futures import APIFuture
from rlkit.losses.base import Loss
from rlkit.losses.builtin import as_builtin, builtin_call
from rlkit.losses.execute import linearised_backward, linearised_forward
from rlkit.types import Datum, ForwardBackwardOutput


def dispatch(trainer: Any, data: List[Datum], loss: Loss, *, named: bool, backward: bool,
             **extensions: Any) -> APIFuture[ForwardBackwardOutput]:
    """Route one checked ``forward_backward`` / ``forward`` call of a
    :class:`~rlkit.engine.clients.TrainingClientBase` by its engine's
    :class:`~rlkit.engine.capabilities.Capabilities` (``loss`` validated ``data``; ``named``: the
    call named a built-in, which :func:`~rlkit.losses.builtin.builtin_loss` built):

    - a named built-in the engine declares and computes on this batch: the engine's primitive;
      any other named built-in: linearised;
    - a Loss object on an engine with ``native_custom_losses``: the engine's primitive;
    - any other Loss object: its built-in on the engine's primitive where it is one the engine
      declares (``forward_backward`` only; ``forward`` scores it linearised), else linearised.
    """
    caps = trainer.capabilities
    primitive = trainer._forward_backward if backward else trainer._forward
    extra = extensions if backward else {}
    if not named and caps.native_custom_losses:
        return primitive(data, loss, **extra)
    if named or backward:
        call = builtin_call(loss)
        if call is not None and caps.supports_builtin(call.name, call.config):
            batch = data if named else loss.native_data(data)
            if trainer._native_batch_ok(call.name, batch):
                return primitive(batch, loss if named else as_builtin(loss), **extra)
    if backward:
        return linearised_backward(trainer, data, loss)
    return linearised_forward(trainer, data, loss)
