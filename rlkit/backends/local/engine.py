"""The local training engine: a causal LM with a PEFT LoRA adapter and an AdamW optimizer, or —
full-parameter fine-tuning, ``LoraSpec(rank=0)`` — the session's own copy of every weight, all
trained (the shared frozen base is copied once, never written).

``forward_backward`` computes per-token logprobs of each datum's ``target_tokens`` and runs a
loss module from :mod:`rlkit.losses` (each formula is defined once, there). Batches are split into
micro-batches of at most ``micro_batch_tokens`` tokens (padding included) and gradients are
accumulated: exact for the built-in losses, which are sums over tokens, and it bounds memory by
tokens rather than rows. Gradients keep accumulating across calls until ``optim_step``.

Precision: ``fp32`` (sampler and trainer logprobs agree to ~1e-6) or ``bf16`` (autocast on the
forward pass, fp32 master weights and optimizer; ~2x faster where the hardware multiplies bf16
quickly, logprob mismatch ~1e-2); ``precision="auto"`` is resolved before the engine is built
(:mod:`.precision`).

Ranks: under ``torchrun`` (``WORLD_SIZE`` > 1) the engine shards its decoder layers with FSDP2 and
splits each batch across the ranks, every rank returning the whole batch's results
(:mod:`.distributed`).

Device: the model's. The LoRA adapter is initialised on the CPU (the same seed gives the same
adapter on every device: peft builds it there, then moves it beside its base layer; the base
weights, possibly shared with other sessions, are never moved or copied); inputs are built on the CPU and
moved once per micro-batch. Losses see the logprobs on the CPU, where the datums' loss inputs
live (the copy is part of the autograd graph, so gradients flow back to the device).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from rlkit.backends.local import activations, distributed, layout, packed
from rlkit.backends.local.pieces import Pieces
from rlkit.backends.local.batching import Unit, make_units, merge_metrics, padded_tokens, right_padded
from rlkit.backends.local.device import autocast, seeded_global_rng
from rlkit.backends.local.families import target_logprobs_for
from rlkit.backends.local.oom import is_out_of_memory, out_of_memory_error
from rlkit.backends.local.prompt_split import run_split_unit
from rlkit.errors import InvalidInputError
from rlkit.losses.base import Loss
from rlkit.types import AdamParams, Datum, ForwardBackwardOutput, OptimStepResponse, TensorData, TokenUsage

LLAMA_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
LLAMA_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class LoraSpec:
    """The adapter a session trains. ``rank=0``: no adapter — every parameter of the model trains
    (full-parameter fine-tuning; ``alpha`` and the layer choices then mean nothing)."""

    rank: int = 32
    alpha: int = 64
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = False
    seed: int = 0

    @property
    def full(self) -> bool:
        """Full-parameter fine-tuning (rank 0): every weight trains."""
        return self.rank == 0

    def target_modules(self, model: torch.nn.Module) -> List[str]:
        names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        wanted = (LLAMA_ATTN if self.train_attn else ()) + (LLAMA_MLP if self.train_mlp else ())
        targets = [n for n in wanted if n in names]
        if not targets:
            raise InvalidInputError(
                f"no LoRA target modules found (looked for {list(wanted)} among linear layers {sorted(names)[:12]})"
            )
        return targets


class TrainingEngine:
    """Owns the trainable model. Not thread-safe: the client runs it on one worker thread."""

    def __init__(
        self,
        model: torch.nn.Module,
        lora: LoraSpec,
        *,
        precision: str = "fp32",
        micro_batch_tokens: int = 2048,
        min_shared_prefix: int = 16,
        device: Optional[torch.device] = None,
        activation_checkpointing: activations.Mode = "auto",
    ):
        if precision not in ("fp32", "bf16"):
            raise InvalidInputError(f"precision={precision!r}: expected 'fp32' or 'bf16'")
        if lora.train_unembed:
            raise InvalidInputError("train_unembed=True is not supported by the local backend (tied embeddings)")
        if lora.rank < 0 or (lora.rank and lora.alpha <= 0):
            raise InvalidInputError(f"LoRA rank={lora.rank} alpha={lora.alpha}: rank must be >= 1 and alpha > 0 "
                                    "(rank 0: full fine-tuning)")
        self.lora = lora
        self.precision = precision
        self.micro_batch_tokens = int(micro_batch_tokens)
        self.min_shared_prefix = int(min_shared_prefix)
        self.activation_checkpointing = activations.check_mode(activation_checkpointing)
        self.model = own_weights(model) if lora.full else _with_adapter(model, lora)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.model.to(self.device)
        self.model.train()
        self.causal_lm = self.model if lora.full else self.model.base_model.model
        self.decoder = self.causal_lm.get_decoder()
        self.lm_head = self.causal_lm.get_output_embeddings()
        self.vocab_size = int(self.causal_lm.config.vocab_size)
        self.max_positions = int(getattr(self.causal_lm.config, "max_position_embeddings", 2048))
        self.pad_id = int(self.causal_lm.config.pad_token_id or 0)
        self.logprobs_fn = target_logprobs_for(self.causal_lm.config)  # Gemma 2: soft-capped logits
        self.compute_dtype = torch.bfloat16 if precision == "bf16" else torch.float32  # the output layer's products
        layers = getattr(self.decoder, "layers", None)
        self.n_layers = len(layers) if isinstance(layers, torch.nn.ModuleList) else 0  # 0: no per-layer checkpointing
        self.group_shared_prefix = self.min_shared_prefix  # what groups a batch's rows (kept together on N ranks)
        self.pack_prefixes = False  # always one packed pass (.packed); else chosen per batch (.layout)
        self.rank, self.world_size = distributed.init()
        if self.world_size > 1:
            if not self.n_layers:
                raise InvalidInputError(f"{type(self.causal_lm).__name__}: no decoder layer list to shard over {self.world_size} ranks")
            distributed.shard(layers)
            self.pack_prefixes = True  # every rank runs one decoder pass per micro-batch (FSDP2's collectives)
        if self.n_layers:
            activations.install(layers)
        self.pass_cost = layout.PassCost.of(layers if self.n_layers else [], self.causal_lm.config)
        self.packed_last = False  # whether the last run's micro-batches ran packed (for tests and benchmarks)
        self.checkpointed_layers: List[int] = []  # per micro-batch of the last run (for tests and benchmarks)
        self.named_trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        a_params = [p for n, p in self.named_trainable if "lora_B" not in n]
        b_params = [p for n, p in self.named_trainable if "lora_B" in n]  # LoRA+: B's own learning rate
        self.optimizer = torch.optim.AdamW([{"params": a_params}] + ([{"params": b_params}] if b_params else []), lr=1e-4,
                                           foreach=False if self.world_size > 1 else None)  # sharded and replicated mixed
        if self.world_size > 1:  # a checkpoint's whole optimizer state, sharded as its parameters
            self.optimizer.register_load_state_dict_post_hook(distributed.shard_optimizer_state)
        self.steps = 0
        self.pending_grad_tokens = 0
        self.loss_scale = 1.0  # what backward scales the loss by (1/N: a whole-batch loss run on each of N ranks)

    # -- forward / backward ----------------------------------------------------------------------
    def _autocast(self):
        return autocast(self.device, self.precision)

    def checkpoint_layers(self, tokens: int) -> int:
        """Decoder layers to checkpoint for a micro-batch of ``tokens`` padded tokens (see
        :mod:`.activations`: all for ``true``, none for ``false``, by the memory budget for ``auto``)."""
        return activations.layers_for(self.activation_checkpointing, tokens, self.n_layers, self.causal_lm.config, self.device, self.model)

    def token_logprobs(self, data: Sequence[Datum], units: Optional[List[Unit]] = None, checkpoint_layers: int = 0,
                       pack: Optional[bool] = None) -> List[torch.Tensor]:
        """Per-datum logprobs of ``target_tokens`` for one micro-batch (keeps the autograd graph;
        decoder layers ``0 .. checkpoint_layers-1`` keep only their inputs and recompute in backward;
        ``pack``: its shared-prompt units in one packed pass, default :attr:`pack_prefixes`).

        ``logprob[t] = log softmax(logits_t / T_t)[target_t]``. Datums of a shared-prefix unit run
        their prompt — and its output layer — once (see :mod:`.batching`); the rest run as
        right-padded rows. Every row of the micro-batch then goes through the output layer in one
        :func:`~.logprobs.target_logprobs` call, which never holds the whole ``[N, V]`` logits."""
        units = units if units is not None else make_units(data, self.min_shared_prefix)
        pieces = Pieces(data)
        with self._autocast():
            if self.pack_prefixes if pack is None else pack:
                with activations.checkpointing(checkpoint_layers, keep_cache=False):
                    per_unit = self._packed_hidden([[data[i].model_input.to_ints() for i in u.indices] for u in units],
                                                   [u.prefix_len for u in units])
                for unit, segments in zip(units, per_unit):
                    pieces.unit(unit, segments)
                units = []  # all done in the packed pass
            plain = [i for u in units if not u.prefix_len for i in u.indices]
            if plain:
                with activations.checkpointing(checkpoint_layers, keep_cache=False):
                    hiddens = self._padded_hidden([data[i].model_input.to_ints() for i in plain])
                for i, hidden in zip(plain, hiddens):
                    pieces.plain(i, hidden)
            shared_units = [u for u in units if u.prefix_len]
            if shared_units:
                tokens = [[data[i].model_input.to_ints() for i in u.indices] for u in shared_units]
                prefixes, suffixes = self._shared_prefix_hidden(tokens, [u.prefix_len for u in shared_units], checkpoint_layers)
                for unit, prefix, unit_suffixes in zip(shared_units, prefixes, suffixes):
                    pieces.shared(unit, prefix, unit_suffixes)
        return pieces.logprobs(self.logprobs_fn, self.lm_head, self.device, self.compute_dtype)

    def _packed_hidden(self, units: List[List[List[int]]], prefix_lens: List[int]) -> List[List[torch.Tensor]]:
        """Every unit as one packed row, all in one decoder pass (:mod:`.packed`): per unit its
        hidden states by segment — a plain unit's datum, or a shared unit's prompt then each
        member's suffix. (A plain unit holds one datum.)"""
        ids, positions, mask, spans = packed.packed_inputs(list(zip(prefix_lens, units)), self.pad_id)
        dev = self.device
        out = self.decoder(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                           use_cache=False).last_hidden_state
        return [[out[r, a:b] for a, b in row] for r, row in enumerate(spans)]

    def packed_pays(self, data: Sequence[Datum]) -> bool:
        """Whether ``data`` suits one packed pass (:func:`.layout.packed_pays`): it may then share a
        fused pass with other runs (:mod:`.fusion`)."""
        return layout.packed_pays(self.pass_cost, data, self.micro_batch_tokens, self.min_shared_prefix)

    def plan(self, data: Sequence[Datum]) -> List[List[Unit]]:
        """``data``'s micro-batches (:meth:`layout`)."""
        return self.layout(data)[0]

    def layout(self, data: Sequence[Datum]) -> Tuple[List[List[Unit]], bool]:
        """``data``'s micro-batches and whether they run packed: always on N ranks (one pass each,
        :func:`.packed.plan`); else the cheaper layout by :func:`.layout.choose` (a shared prompt's
        unit packed, or in two passes: :func:`~.batching.plan_micro_batches`)."""
        if self.pack_prefixes:
            plan = packed.plan(data, self.micro_batch_tokens, self.min_shared_prefix)
            if not self.pass_cost.fits(plan):
                longest = max(packed.packed_len(u) for batch in plan for u in batch)
                raise InvalidInputError(f"a packed row of {longest} tokens is longer than the model's {self.pass_cost.window}-token "
                                        f"sliding window: on N ranks each group runs as one packed row, which the window's mask "
                                        f"does not reach; use shorter groups or one process")
            return plan, True
        return layout.choose(self.pass_cost, data, self.micro_batch_tokens, self.min_shared_prefix)

    def _padded_hidden(self, tokens: List[List[int]]) -> List[torch.Tensor]:
        input_ids, mask = right_padded(tokens, self.pad_id)
        out = self.decoder(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device), use_cache=False).last_hidden_state
        return [out[i, : len(t)] for i, t in enumerate(tokens)]

    def _shared_prefix_hidden(self, units: List[List[List[int]]], prefix_lens: List[int], checkpoint_layers: int = 0) -> Tuple[List[torch.Tensor], List[List[torch.Tensor]]]:
        """Run each unit's shared prompt once (all prompts in one left-padded batch), then every
        member's suffix against its prompt's key/value cache (all suffixes in one batch).

        Returns each unit's prompt hidden states and each member's suffix hidden states."""
        from transformers import DynamicCache

        width = max(prefix_lens)
        ids = torch.full((len(units), width), self.pad_id, dtype=torch.long)
        prefix_mask = torch.zeros((len(units), width), dtype=torch.long)
        for u, (members, p) in enumerate(zip(units, prefix_lens)):
            ids[u, width - p :] = torch.tensor(members[0][:p])
            prefix_mask[u, width - p :] = 1
        positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        cache = DynamicCache(config=self.causal_lm.config)  # every layer's entry exists before it runs (checkpointing)
        with activations.checkpointing(checkpoint_layers, keep_cache=True):  # the suffixes read what the prompt wrote
            prefix_out = self.decoder(input_ids=ids.to(dev), attention_mask=prefix_mask.to(dev), position_ids=positions.to(dev),
                                      cache=cache, use_cache=True).last_hidden_state
        row_unit = [u for u, members in enumerate(units) for _ in members]
        suffixes = [t[prefix_lens[u] :] for u, members in enumerate(units) for t in members]
        cache.batch_select_indices(torch.tensor(row_unit, device=dev))  # each row gets its unit's cache (differentiable)
        s_ids, s_mask = right_padded(suffixes, self.pad_id)
        s_width = s_ids.shape[1]
        s_pos = torch.tensor([prefix_lens[u] for u in row_unit]).unsqueeze(1) + torch.arange(s_width).unsqueeze(0)
        mask = torch.cat([prefix_mask[row_unit], s_mask], dim=1)
        with activations.checkpointing(checkpoint_layers, keep_cache=False):
            out = self.decoder(input_ids=s_ids.to(dev), attention_mask=mask.to(dev), position_ids=s_pos.to(dev),
                               cache=cache, use_cache=True).last_hidden_state
        prefix_hidden = [prefix_out[u, width - p :] for u, p in enumerate(prefix_lens)]
        suffix_hidden: List[List[torch.Tensor]] = [[] for _ in units]
        for r, (u, s) in enumerate(zip(row_unit, suffixes)):
            suffix_hidden[u].append(out[r, : len(s)])
        return prefix_hidden, suffix_hidden

    def run(self, data: Sequence[Datum], loss: Loss, *, backward: bool) -> ForwardBackwardOutput:
        """Forward (and backward) ``loss`` over ``data`` in micro-batches; grads accumulate. On N
        ranks, each runs its share and every rank returns the whole batch's (:mod:`.distributed`)."""
        if self.world_size > 1:
            return distributed.run(self, data, loss, backward)
        return self.run_local(data, loss, backward=backward)

    def run_local(self, data: Sequence[Datum], loss: Loss, *, backward: bool, micro_batches: int = 0) -> ForwardBackwardOutput:
        """:meth:`run` on this process's data; then idle passes up to ``micro_batches`` (on N ranks
        every rank runs as many layer passes as the busiest)."""
        outputs: List[Optional[Dict[str, TensorData]]] = [None] * len(data)
        metrics: Dict[str, float] = {}
        mean_weights: Dict[str, float] = {}
        if loss.datum_separable:
            batches, pack = self.layout(data)
        else:
            batches, pack = [make_units(data, self.min_shared_prefix)], self.pack_prefixes
        self.packed_last = pack
        self.checkpointed_layers = []
        for number, units in enumerate(batches, 1):
            group = [i for u in units for i in u.indices]
            chunk = [data[i] for i in group]
            local, k = [], 0
            for u in units:  # renumber unit indices into the chunk
                local.append(Unit(list(range(k, k + len(u.indices))), u.prefix_len, u.lengths, u.rows_per_part))
                k += len(u.indices)
            tokens = len(units) * max(map(packed.packed_len, units)) if pack else padded_tokens(units)
            layers = self.checkpoint_layers(tokens) if backward else 0
            self.checkpointed_layers.append(layers)
            failure = None
            try:
                if local[0].rows_per_part:  # one group over the budget: in parts, its prompt once
                    logprobs = run_split_unit(self, chunk, local[0], loss, backward=backward, layers=layers,
                                              on_part=lambda m: merge_metrics(metrics, m, mean_weights))
                    part = {}
                else:
                    logprobs, part = self._micro_batch(chunk, local, loss, backward, layers, pack)
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is translated; the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                failure = out_of_memory_error(
                    "forward_backward" if backward else "forward", number, len(batches), tokens, len(chunk),
                    self.micro_batch_tokens, layers, self.n_layers, self.activation_checkpointing, exc,
                )
            if failure is not None:  # raised outside the handler: the failed graph is freed first
                logprobs = part = None
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                raise failure
            merge_metrics(metrics, part, mean_weights)
            for i, lp in zip(group, logprobs):
                outputs[i] = {"logprobs": TensorData.from_torch(lp.detach())}
        for _ in range(micro_batches - len(batches)):
            self._idle_pass(backward)
        n_tokens = sum(d.model_input.length for d in data)
        if backward:
            self.pending_grad_tokens += n_tokens
        metrics["tokens:train"] = float(n_tokens)
        return ForwardBackwardOutput(
            loss_fn_outputs=outputs,  # type: ignore[arg-type]
            metrics=metrics,
            usage=TokenUsage(train_tokens=n_tokens),
        )

    def _idle_pass(self, backward: bool) -> None:
        """A one-token pass with zero loss: this rank's part in the layers' collectives when it has
        no micro-batch left (its gradient contribution is zero)."""
        with torch.set_grad_enabled(backward), self._autocast():
            ids = torch.tensor([[self.pad_id]], device=self.device)
            value = self.decoder(input_ids=ids, use_cache=False).last_hidden_state.float().sum() * 0.0
        if backward:
            value.backward()

    def _micro_batch(self, chunk: List[Datum], units: List[Unit], loss: Loss, backward: bool, layers: int, pack: bool):
        with torch.set_grad_enabled(backward):
            logprobs = self.token_logprobs(chunk, units, layers, pack)
            value, part = loss(chunk, logprobs)
            if backward:
                self.backward(value * self.loss_scale if self.loss_scale != 1.0 else value, loss)
        return logprobs, part

    @staticmethod
    def backward(value: torch.Tensor, loss: Loss) -> None:
        """``value.backward()``, refused in one line if the loss is not finite."""
        if not torch.isfinite(value):
            raise InvalidInputError(f"{loss.name}: the loss is {float(value.detach())} (not finite); gradients left unchanged")
        value.backward()

    # -- optimizer ----------------------------------------------------------------------------------
    def optim_step(self, params: AdamParams) -> OptimStepResponse:
        """One AdamW step with ``params`` (per-step values honoured), then zero the gradients."""
        rates = (params.learning_rate, params.learning_rate * (params.lora_plus_lr_ratio or 1.0))  # A (or all), B
        for group, lr in zip(self.optimizer.param_groups, rates):
            group["lr"] = lr
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        trainable = [p for _, p in self.named_trainable]
        max_norm = params.grad_clip_norm if params.grad_clip_norm is not None else math.inf
        for p in trainable:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.world_size > 1:
            distributed.sum_replicated_grads(trainable)
            grad_norm = distributed.clip_grad_norm(trainable, max_norm)
        else:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, max_norm))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.pending_grad_tokens = 0
            raise InvalidInputError(f"optim_step: gradient norm is {grad_norm}; the step was skipped and gradients cleared")
        # An update that overflows the weights (lr 1e308, eps 0 on a zero gradient) is rolled back.
        # The snapshot that allows it costs about a step, so it is taken only when a cheap bound on
        # the update (three max-reductions, _may_overflow) does not prove the weights stay finite.
        saved = None
        if self._may_overflow(trainable, params):
            saved = ([p.detach().clone() for p in trainable], copy.deepcopy(self.optimizer.state_dict()))
        self.optimizer.step()
        finite = distributed.all_finite(trainable) if self.world_size > 1 else all(bool(torch.isfinite(p).all()) for p in trainable)
        if not finite:
            self.optimizer.zero_grad(set_to_none=True)
            self.pending_grad_tokens = 0
            if saved is None:  # the bound says this cannot happen; refuse all the same
                raise InvalidInputError(f"optim_step: learning_rate={params.learning_rate:g} made the weights non-finite")
            with torch.no_grad():
                for p, old in zip(trainable, saved[0]):
                    p.copy_(old)
            self.optimizer.load_state_dict(saved[1])
            raise InvalidInputError(
                f"optim_step: learning_rate={params.learning_rate:g} (beta1={params.beta1:g}, beta2={params.beta2:g}, "
                f"eps={params.eps:g}) would make the weights non-finite; "
                "the step was rolled back (weights and optimizer unchanged) and gradients cleared"
            )
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        tokens, self.pending_grad_tokens = self.pending_grad_tokens, 0
        return OptimStepResponse(
            metrics={
                "grad_norm": grad_norm,
                "learning_rate": params.learning_rate,
                "step": float(self.steps),
                "tokens:accumulated": float(tokens),
            }
        )

    @torch.no_grad()
    def _may_overflow(self, trainable: List[torch.Tensor], params: AdamParams) -> bool:
        """Whether this AdamW step could make a weight non-finite. With 0 <= beta1, beta2 < 1 and
        eps > 0, every element moves by at most lr * |m_hat| / eps, and |m_hat| is at most
        max(|m|, |g|) / (1 - beta1) (m a convex mix of past gradients, bias correction at least
        1 - beta1); with decay the weight is first scaled by |1 - lr * weight_decay|. If even that
        bound, and the optimizer's own factors (lr / (1 - beta1), lr * weight_decay), doubled for
        rounding, stay below the dtype's largest value, no snapshot is needed."""
        b1, b2, eps = params.beta1, params.beta2, params.eps
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0 and eps > 0.0):
            return True
        lr = max(abs(float(group["lr"])) for group in self.optimizer.param_groups)
        moments = [self.optimizer.state.get(p, {}).get("exp_avg") for p in trainable]
        tensors = [*trainable, *(p.grad for p in trainable), *(m for m in moments if m is not None)]
        n = len(trainable)
        if self.world_size > 1:
            weight, moment = distributed.max_abs(tensors[:n]), distributed.max_abs(tensors[n:])
        else:
            top = torch._foreach_norm(tensors, float("inf"))
            weight = float(torch.stack(top[:n]).max())
            moment = float(torch.stack(top[n:]).max())
        step = lr / (1.0 - b1)  # the step size bound; as the optimizer's own factor it must be finite too (0 * inf)
        bound = weight * abs(1.0 - lr * params.weight_decay) + step * moment / eps
        largest = min(float(torch.finfo(p.dtype).max) for p in trainable)
        return not (math.isfinite(bound) and 2.0 * max(bound, step, lr * abs(params.weight_decay)) < largest)

    # -- adapter snapshots (for the sampler and checkpoints) ---------------------------------------
    def lora_modules(self) -> Dict[str, Tuple[torch.Tensor, torch.Tensor, float]]:
        """``{module path in the causal LM: (A, B, scale)}`` — live tensors, not copies (none in
        full fine-tuning)."""
        from peft.tuners.lora import LoraLayer

        out: Dict[str, Tuple[torch.Tensor, torch.Tensor, float]] = {}
        prefix = "base_model.model."
        for name, module in self.model.named_modules():
            if isinstance(module, LoraLayer) and "default" in module.lora_A:
                path = name[len(prefix):] if name.startswith(prefix) else name
                out[path] = (module.lora_A["default"].weight, module.lora_B["default"].weight, float(module.scaling["default"]))
        return out

    def adapter_snapshot(self) -> Any:
        """A detached copy of the trained weights, safe to hand to another thread: the adapter
        ``{path: (A, B, scale)}``, or in full fine-tuning every parameter (:class:`FullWeights`)."""
        if self.lora.full:
            return FullWeights({n: distributed.full(p.detach()).clone() for n, p in self.model.named_parameters()})
        full = distributed.full
        return {k: (full(a.detach()).clone(), full(b.detach()).clone(), s) for k, (a, b, s) in self.lora_modules().items()}

    @torch.no_grad()
    def load_weights(self, tensors: Dict[str, torch.Tensor]) -> None:
        """Put a checkpoint's tensors into the session: PEFT's adapter keys, or in full fine-tuning
        the model's parameter names (as ``save_pretrained`` wrote them; a tied alias may be absent).
        Raises ``ValueError``/``RuntimeError`` naming a key this model lacks, a parameter the
        checkpoint lacks, or a shape that differs; the caller restores what was written before.
        On N ranks each keeps its shard of the whole tensors."""
        if not self.lora.full and self.world_size == 1:
            from peft import set_peft_model_state_dict

            unexpected = list(getattr(set_peft_model_state_dict(self.model, tensors), "unexpected_keys", None) or [])
            if unexpected:
                raise ValueError(f"it holds tensors this adapter does not have, e.g. {unexpected[0]}")
            return
        named = dict(self.model.named_parameters(remove_duplicate=False))  # tied aliases too
        if not self.lora.full:  # PEFT's saved keys drop the adapter's name
            named = {n.replace(".default.", "."): p for n, p in named.items() if p.requires_grad}
        unexpected = [k for k in tensors if k not in named]
        if unexpected:
            raise ValueError(f"it holds tensors this model does not have, e.g. {unexpected[0]}")
        given = {id(named[k]) for k in tensors}
        missing = [n for n, p in self.named_trainable if id(p) not in given]
        if missing:
            raise ValueError(f"it lacks parameter {missing[0]}")
        for key, value in tensors.items():
            named[key].copy_(distributed.shard_like(named[key], value))


class FullWeights(dict):
    """``{parameter name: tensor}``: a full fine-tuning session's weights, as the sampler takes
    them (an adapter is ``{module path: (A, B, scale)}`` instead)."""


def own_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its own tensors (ties kept), every parameter trainable: what a
    full fine-tuning session writes, never the shared frozen base."""
    owned = copy.deepcopy(model)
    for p in owned.parameters():
        p.requires_grad_(True)
    return owned


def _with_adapter(model: torch.nn.Module, lora: LoraSpec) -> torch.nn.Module:
    """``model`` wrapped with a fresh PEFT LoRA adapter (initialised from ``lora.seed``)."""
    from peft import LoraConfig, get_peft_model

    from rlkit.backends.local.models import quiet_loading

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=lora.target_modules(model), lora_dropout=0.0, bias="none")
    with seeded_global_rng(lora.seed), quiet_loading():  # peft asks transformers a deprecated question
        return get_peft_model(model, config)  # peft initialises each adapter on the CPU, then moves it
