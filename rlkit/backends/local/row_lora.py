"""Per-row, unmerged LoRA for the sampler: several adapters' rows in one prefill and one decode.

A batch whose row ``i`` carries adapter ``k_i`` (``None``: the base model) computes, in every
adapted linear layer,

    y = x W^T + b                                  (all rows, one product over the frozen base)
    y[rows of k] += (x[rows of k] A_k^T) (scale_k B_k)^T   (each adapter, its own rows only)

— the arithmetic of :mod:`.multi_lora` (the training side), here without autograd and with the
sampler's own layouts:

- :class:`PackedAdapter` is one adapter (``{module path: (A [rank, in], B [out, rank], scale)}``)
  moved once to the sampler's device and precision with ``scale`` folded into ``B``, and, for the
  lean decode (:class:`~.decode.FusedWeights`), stacked like the fused weights: per layer one
  ``(A, B)`` for ``q/k/v`` (the three ``A`` stacked, ``B`` block-diagonal, so its product lands in
  the fused ``qkv`` output's columns), one for ``o_proj``, one for ``gate/up``, one for
  ``down_proj``: two small products per site per adapter per step.
- :class:`RowLora` groups a batch's rows by adapter (a contiguous run is a slice, otherwise an
  ``index_select`` / ``index_add_``), and adds each group's low-rank product to a layer's output.
- :class:`RowLoraHooks` applies a :class:`RowLora` inside the model's own forward (prefill, the
  generic decode loop, prompt scoring): a forward hook on each adapted ``nn.Linear`` that adds the
  active routing's product, and does nothing when no routing is active.

Rows never mix in a causal LM, so a row's numbers are those of the same adapter merged
(``W + scale B A``) up to float rounding: the sampler's tolerance is stated in :mod:`.sampler`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

#: ``{module path in the causal LM: (A [rank, in], B [out, rank], scale)}`` (as in :mod:`.multi_lora`)
Adapter = Mapping[str, Tuple[torch.Tensor, torch.Tensor, float]]
Pair = Tuple[torch.Tensor, torch.Tensor]  # (A [r, in], scale * B [out, r])
#: the fused decode's four products per layer: (site, the layer's submodule, its projections)
SITES = (("qkv", "self_attn", ("q_proj", "k_proj", "v_proj")), ("o", "self_attn", ("o_proj",)),
         ("gate_up", "mlp", ("gate_proj", "up_proj")), ("down", "mlp", ("down_proj",)))


def _stack(pairs: Sequence[Optional[Pair]], widths: Sequence[int]) -> Optional[Pair]:
    """One ``(A, B)`` for projections that share an input and whose outputs are concatenated:
    the ``A`` stacked, ``B`` block-diagonal (a projection the adapter does not adapt: zero rows)."""
    present = [(j, p) for j, p in enumerate(pairs) if p is not None]
    if not present:
        return None
    a = torch.cat([p[0] for _, p in present])
    b = a.new_zeros((sum(widths), a.shape[0]))
    offsets = [sum(widths[:j]) for j in range(len(widths))]
    col = 0
    for j, (_, pb) in present:
        b[offsets[j] : offsets[j] + widths[j], col : col + pb.shape[1]] = pb
        col += pb.shape[1]
    return a, b


class PackedAdapter:
    """An adapter in the sampler's device and dtype (see the module docstring). ``layers``: the
    fused decode's ``(layer path prefix, {projection: out width})`` per layer, or ``None`` when the
    sampler has no lean decode."""

    def __init__(self, adapter: Adapter, device: torch.device, dtype: torch.dtype,
                 layers: Optional[Sequence[Tuple[str, Dict[str, int]]]] = None):
        self.paths: Dict[str, Pair] = {}
        for path, (a, b, scale) in adapter.items():
            a32, b32 = a.detach().to(device=device, dtype=torch.float32), b.detach().to(device=device, dtype=torch.float32)
            self.paths[path] = (a32.to(dtype), (b32 * float(scale)).to(dtype))
        self.sites: List[Dict[str, Optional[Pair]]] = []
        for prefix, widths in layers or ():
            per_site: Dict[str, Optional[Pair]] = {}
            for site, parent, names in SITES:
                paths = [f"{prefix}.{parent}.{n}" for n in names]
                per_site[site] = _stack([self.paths.get(p) for p in paths], [widths[n] for n in names])
            self.sites.append(per_site)


@dataclass(frozen=True)
class _Group:
    adapter: PackedAdapter
    start: int
    stop: int
    index: Optional[torch.Tensor]  # None: rows[start:stop]


def _add(out: torch.Tensor, x: torch.Tensor, group: _Group, pair: Pair) -> None:
    a, b = pair
    if group.index is None:
        out[group.start : group.stop] += F.linear(F.linear(x[group.start : group.stop], a), b)
    else:
        out.index_add_(0, group.index, F.linear(F.linear(x.index_select(0, group.index), a), b))


class RowLora:
    """Which rows of a batch use which adapter (``None``: the base model only): one group per
    adapter, in order of first appearance."""

    def __init__(self, row_adapters: Sequence[Optional[PackedAdapter]], device: torch.device):
        self.rows = len(row_adapters)
        rows_of: Dict[int, Tuple[PackedAdapter, List[int]]] = {}
        for i, adapter in enumerate(row_adapters):
            if adapter is not None:
                rows_of.setdefault(id(adapter), (adapter, []))[1].append(i)
        self.groups: List[_Group] = []
        for adapter, rows in rows_of.values():
            contiguous = rows[-1] - rows[0] + 1 == len(rows)
            index = None if contiguous else torch.tensor(rows, dtype=torch.long, device=device)
            self.groups.append(_Group(adapter, rows[0], rows[-1] + 1, index))

    def _check(self, x: torch.Tensor, where: str) -> None:
        if x.shape[0] != self.rows:
            raise ValueError(f"per-row LoRA at {where}: the input has {x.shape[0]} rows, the routing {self.rows}")

    def add_site(self, out: torch.Tensor, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """``out`` (the fused decode's ``site`` product of layer ``layer`` for input ``x``) plus each
        adapter's low-rank product on its rows, in place; returns ``out``."""
        self._check(x, f"layer {layer} {site}")
        for group in self.groups:
            pair = group.adapter.sites[layer][site]
            if pair is not None:
                _add(out, x, group, pair)
        return out

    def add_path(self, out: torch.Tensor, x: torch.Tensor, path: str) -> None:
        """``out`` (the output of the linear layer at ``path`` for input ``x``) plus each adapter's
        low-rank product on its rows, in place."""
        self._check(x, path)
        for group in self.groups:
            pair = group.adapter.paths.get(path)
            if pair is not None:
                _add(out, x, group, pair)


class RowLoraHooks:
    """Forward hooks that apply the active :class:`RowLora` to a model's own forward (see the
    module docstring). A hook is installed on a layer the first time an adapter needs it, and stays."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.active: Optional[RowLora] = None
        self._hooked: Dict[str, torch.utils.hooks.RemovableHandle] = {}

    def unknown_paths(self, adapter: Adapter) -> List[str]:
        """The paths of ``adapter`` that are not linear layers of the model."""
        modules = dict(self.model.named_modules())
        return sorted(p for p in adapter if not isinstance(modules.get(p), torch.nn.Linear))

    def install(self, paths: Sequence[str]) -> None:
        for path in paths:
            if path not in self._hooked:
                self._hooked[path] = self.model.get_submodule(path).register_forward_hook(self._hook(path))

    def _hook(self, path: str):
        def hook(module: torch.nn.Module, args: tuple, out: torch.Tensor) -> None:
            if self.active is not None:
                self.active.add_path(out, args[0], path)

        return hook

    @contextlib.contextmanager
    def routed(self, lora: Optional[RowLora]) -> Iterator[None]:
        """Within this block the model's forward routes its rows by ``lora`` (``None``: base/merged weights)."""
        previous, self.active = self.active, lora
        try:
            yield
        finally:
            self.active = previous
