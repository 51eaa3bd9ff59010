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
  With two or more adapters in the lean decode it adds them all at once
  (:class:`StackedSites`): the adapters' ``A^T`` and ``B^T`` of a site stacked as
  ``[K, in, r]`` and ``[K, r, out]`` (ranks zero-padded to the largest), the rows gathered into
  ``[K, m, in]`` (``m`` the largest group; a padded slot's low-rank activations are zeroed), and
  ``Y = (X A^T) B^T`` as two batched products — two matmuls a site instead of two per adapter,
  the same arithmetic (zero padding adds exact zeros). Measured on 2 CPU cores (SmolLM2 in bf16, 4
  adapters x 8 rows): the per-adapter products were a third of the decode's time, almost all of it
  per-call overhead of ~1,000 small products a step.
- :class:`RowLoraHooks` applies a :class:`RowLora` inside the model's own forward (prefill, the
  generic decode loop, prompt scoring): a forward hook on each adapted ``nn.Linear`` that adds the
  active routing's product, and does nothing when no routing is active.

Rows never mix in a causal LM, so a row's numbers are those of the same adapter merged
(``W + scale B A``) up to float rounding: the sampler's tolerance is stated in :mod:`.sampler`.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple

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
        self.dtype = dtype
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


class StackedSites:
    """Several :class:`PackedAdapter` s' lean-decode sites, stacked for one batched product per
    site (see the module docstring): ``sites[layer][site]`` is ``(A^T [K, in, r], B^T [K, r, out])``
    in the order of :attr:`adapters` (``r`` the largest rank; zeros where an adapter's rank is
    smaller or it does not adapt that projection), or ``None`` where none of them adapts it."""

    def __init__(self, adapters: Sequence[PackedAdapter]):
        self.adapters = tuple(adapters)  # held, so the ids that key a cache of these stay theirs
        k = len(self.adapters)
        self.sites: List[Dict[str, Optional[Pair]]] = []
        for layer in range(len(self.adapters[0].sites)):
            per_site: Dict[str, Optional[Pair]] = {}
            for site, _, _ in SITES:
                pairs = [a.sites[layer][site] for a in self.adapters]
                present = [p for p in pairs if p is not None]
                if not present:
                    per_site[site] = None
                    continue
                rank = max(a.shape[0] for a, _ in present)
                a0, b0 = present[0]
                at, bt = a0.new_zeros((k, a0.shape[1], rank)), b0.new_zeros((k, rank, b0.shape[0]))
                for j, pair in enumerate(pairs):
                    if pair is not None:
                        at[j, :, : pair[0].shape[0]] = pair[0].T
                        bt[j, : pair[1].shape[1]] = pair[1].T
                per_site[site] = (at, bt)
            self.sites.append(per_site)


def _keep_recent(cache: "OrderedDict[Hashable, Any]", key: Hashable, value: Any, limit: int) -> Any:
    """``cache[key] = value`` as its most recent entry, the oldest dropped beyond ``limit``; ``value``."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > limit:
        cache.popitem(last=False)
    return value


class PackedCache:
    """The sampler's per-row adapters: :class:`PackedAdapter` s by weights key (the last
    ``packed_limit``; a key's entry is rebuilt when its adapter object changes) and sets of them
    as :class:`StackedSites` (the last ``stacked_limit`` sets: a decode keeps one set for many
    steps). ``on_pack(paths)`` hears the paths of each adapter packed (the sampler hooks them)."""

    def __init__(self, device: torch.device, dtype: torch.dtype, layout: Optional[Sequence[Tuple[str, Dict[str, int]]]],
                 on_pack: Callable[[List[str]], None], packed_limit: int = 16, stacked_limit: int = 2):
        self.device, self.dtype, self.layout, self.on_pack = device, dtype, layout, on_pack
        self.packed_limit, self.stacked_limit = packed_limit, stacked_limit
        self.packed: "OrderedDict[str, Tuple[Adapter, PackedAdapter]]" = OrderedDict()
        self.stacked: "OrderedDict[Tuple[int, ...], StackedSites]" = OrderedDict()

    def pack(self, key: str, adapter: Optional[Adapter]) -> Optional[PackedAdapter]:
        """``adapter`` packed for per-row use (``None`` for none)."""
        if adapter is None:
            return None
        cached = self.packed.get(key)
        if cached is None or cached[0] is not adapter:
            self.on_pack(sorted(adapter))
            cached = (adapter, PackedAdapter(adapter, self.device, self.dtype, self.layout))
        return _keep_recent(self.packed, key, cached, self.packed_limit)[1]

    def stack(self, adapters: Tuple[PackedAdapter, ...]) -> StackedSites:
        """``adapters`` stacked for the batched per-row products (a set held keeps its members' ids theirs)."""
        key = tuple(id(a) for a in adapters)
        stacked = self.stacked.get(key) or StackedSites(adapters)
        return _keep_recent(self.stacked, key, stacked, self.stacked_limit)


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
    adapter, in order of first appearance. ``stacker``: given the batch's adapters (two or more,
    ordered by ``id``), their :class:`StackedSites` (the caller caches them); with it,
    :meth:`add_site` adds all adapters' products in two batched matmuls."""

    def __init__(self, row_adapters: Sequence[Optional[PackedAdapter]], device: torch.device,
                 stacker: Optional[Callable[[Tuple[PackedAdapter, ...]], StackedSites]] = None):
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
        self.stacked: Optional[StackedSites] = None
        if stacker is not None and len(rows_of) >= 2 and all(a.sites for a, _ in rows_of.values()):
            order = [rows_of[key] for key in sorted(rows_of)]
            self.stacked = stacker(tuple(a for a, _ in order))
            self._plan(order, device)

    def _plan(self, order: Sequence[Tuple[PackedAdapter, List[int]]], device: torch.device) -> None:
        """The batched layout: slot ``(k, j)`` holds row ``gather[k * m + j]`` of adapter ``k``
        (``m`` rows a slot block; a shorter group repeats its first row, and ``keep`` zeroes it).
        ``gather is None``: the batch's rows are already that layout."""
        self.k, self.m = len(order), max(len(rows) for _, rows in order)
        gather: List[int] = []
        keep: List[float] = []
        for _, rows in order:
            pad = self.m - len(rows)
            gather += rows + [rows[0]] * pad
            keep += [1.0] * len(rows) + [0.0] * pad
        self.gather = None if gather == list(range(self.rows)) else torch.tensor(gather, dtype=torch.long, device=device)
        dtype = order[0][0].dtype
        self.keep = None if all(keep) else torch.tensor(keep, dtype=dtype, device=device).view(self.k, self.m, 1)

    def _check(self, x: torch.Tensor, where: str) -> None:
        if x.shape[0] != self.rows:
            raise ValueError(f"per-row LoRA at {where}: the input has {x.shape[0]} rows, the routing {self.rows}")

    def add_site(self, out: torch.Tensor, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """``out`` (the fused decode's ``site`` product of layer ``layer`` for input ``x``) plus each
        adapter's low-rank product on its rows, in place; returns ``out``."""
        self._check(x, f"layer {layer} {site}")
        if self.stacked is not None:
            pair = self.stacked.sites[layer][site]
            if pair is not None:
                self._add_stacked(out, x, pair)
            return out
        for group in self.groups:
            pair = group.adapter.sites[layer][site]
            if pair is not None:
                _add(out, x, group, pair)
        return out

    def _add_stacked(self, out: torch.Tensor, x: torch.Tensor, pair: Pair) -> None:
        """``out[rows] += (x[rows] A_k^T) B_k^T`` for every adapter ``k`` at once: two ``bmm``."""
        at, bt = pair
        xs = x if self.gather is None else x.index_select(0, self.gather)
        h = torch.bmm(xs.reshape(self.k, self.m, -1), at)
        if self.keep is not None:
            h = h * self.keep
        y = torch.bmm(h, bt).view(self.k * self.m, -1)
        if self.gather is None:
            out += y
        else:
            out.index_add_(0, self.gather, y)

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
