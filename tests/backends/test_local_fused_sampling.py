"""Different runs' LoRA weights share one decode (per-row, unmerged LoRA in the sampler): each
request gets the tokens it gets alone (greedy: identical; sampled, same seed: identical tokens,
logprobs within 1e-4 in fp32), full fine-tuning weights still decode alone, and one request's
failure (weights that fail to load) fails only that request. Only with ``fuse_runs=True``: without it
(``--no-fuse-runs``, today's code) every decode batch holds one adapter, as before issue 43."""

from __future__ import annotations

import threading

import pytest
import torch

from rlkit.types import SamplingParams

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOL = 1e-4


def _pinned(svc):
    """``svc``'s tiny-model sampler worker, holding three adapters of ranks 2, 4 (attention only) and 8."""
    w = svc.create_sampling_client(base_model="tiny")._runtime.sampler
    g = torch.Generator().manual_seed(0)
    for key, rank, names in (("run-a", 2, PROJECTIONS), ("run-b", 4, PROJECTIONS[:4]), ("run-c", 8, PROJECTIONS)):
        adapter = {}
        for path, m in w.sampler.model.named_modules():
            if isinstance(m, torch.nn.Linear) and path.rsplit(".", 1)[-1] in names:
                adapter[path] = (torch.randn(rank, m.in_features, generator=g) * 0.5,
                                 torch.randn(m.out_features, rank, generator=g) * 0.5, 2.0 / rank)
        w.pin(key, adapter)
    return w


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """The sampler worker of a fusing service (``fuse_runs=True``), with :func:`_pinned`'s adapters."""
    import rlkit

    svc = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("ckpt"), fuse_runs=True)
    yield _pinned(svc)
    svc.close()


def _request(prompt, greedy: bool, **kw):
    from rlkit.backends.local.sampler import SampleRequest

    params = SamplingParams(max_tokens=6, temperature=0.0) if greedy else SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    return SampleRequest(prompt, 2, params, include_prompt_logprobs=True, **kw)


def _job(key, kind, payload):
    from rlkit.backends.local.workers import make_job

    return make_job(key, kind, payload, kind)


def _same(got, want) -> None:
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    for g, w in zip(got.sequences, want.sequences):
        assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < TOL
    assert max(abs(a - b) for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:])) < TOL


def _queued_together(worker, jobs):
    """Submit ``jobs`` while the worker cannot take any, so its next batch finds them all queued."""
    with worker._ready:  # a re-entrant lock: submitting from this thread still works
        futures = [worker.submit(j) for j in jobs]
    return [f.result(timeout=120) if j.kind == "sample" else f for f, j in zip(futures, jobs)]


def test_three_adapters_and_the_base_share_one_decode_and_each_gets_its_solo_result(worker):
    keys = ["run-a", "run-b", "run-c", ""]
    specs = [(key, greedy) for key in keys for greedy in (True, False)]

    def _request(prompt, greedy):  # a listener: the base's requests have no twin (twins.py), they decode
        return globals()["_request"](prompt, greedy, on_token=lambda i, token: None)

    alone = [worker.submit(_job(key, "sample", _request([1, 2, 3, 4], greedy))).result(timeout=120) for key, greedy in specs]
    scored_alone = [worker.submit(_job(key, "logprobs", [5, 6, 7, 8, 9])).result(timeout=120) for key in keys]
    for a, b in zip(alone[::2], alone[2::2]):
        assert a.sequences[0].tokens != b.sequences[0].tokens  # the adapters really differ

    before = (worker.decodes, worker.mixed_decodes)
    jobs = [_job(key, "sample", _request([1, 2, 3, 4], greedy)) for key, greedy in specs]
    jobs += [_job(key, "logprobs", [5, 6, 7, 8, 9]) for key in keys]
    results = _queued_together(worker, jobs)
    assert (worker.decodes, worker.mixed_decodes) == (before[0] + 1, before[1] + 1)  # ONE decode for all eight
    assert worker.last_batch_keys == frozenset(keys)
    assert any(len(s.adapters) == 3 for s in worker.sampler.packs.stacked.values())  # the batched products ran
    for got, want in zip(results, alone):
        _same(got, want)
    for future, want in zip(results[len(specs):], scored_alone):
        got = future.result(timeout=120)
        assert max(abs(a - b) for a, b in zip(got[1:], want[1:])) < TOL


def test_another_adapter_joins_a_running_merged_decode(worker):
    """A batch that started with one adapter (merged) admits another's request between two steps:
    it turns per-row, and both requests still get their solo tokens."""
    alone = [worker.submit(_job(key, "sample", _request([3, 1, 4], True))).result(timeout=120) for key in ("run-a", "run-c")]
    joined = threading.Event()
    second = _job("run-c", "sample", _request([3, 1, 4], True))

    def on_token(i, token):
        if not joined.is_set():
            joined.set()
            worker.submit(second)  # arrives while run-a's decode runs

    first = worker.submit(_job("run-a", "sample", _request([3, 1, 4], True, on_token=on_token)))
    before = worker.mixed_decodes
    _same(first.result(timeout=120), alone[0])
    _same(second.future.result(timeout=120), alone[1])
    assert worker.mixed_decodes == before + 1 and worker.last_batch_keys == frozenset({"run-a", "run-c"})


def test_after_a_mixed_decode_one_adapter_starts_per_row_and_after_a_lone_one_merges(worker):
    """The merge is skipped while runs mix (their next decode would undo it at the first join) and
    comes back once a decode held one adapter alone; the tokens are the solo ones either way."""
    alone = worker.submit(_job("run-a", "sample", _request([4, 4, 2], True))).result(timeout=120)
    _queued_together(worker, [_job(key, "sample", _request([4, 4, 2], True)) for key in ("run-b", "run-c")])
    assert worker.sampler.mixing
    modes = []

    def job():
        return _job("run-a", "sample", _request([4, 4, 2], True, on_token=lambda i, t: modes.append(worker.sampler.per_row)))

    _same(worker.submit(job()).result(timeout=120), alone)  # after the mixed decode: per-row, no merge
    assert modes and all(modes)
    modes.clear()
    _same(worker.submit(job()).result(timeout=120), alone)  # after a lone decode: merged again
    assert modes and not any(modes) and worker.sampler.weights_key == "run-a"


def test_full_weights_decode_alone_and_a_failing_load_fails_only_its_request(worker):
    from rlkit.backends.local.engine import FullWeights

    norm = worker.sampler.base.get_parameter("model.norm.weight")
    worker.pin("full-run", FullWeights({"model.norm.weight": norm.detach() * 1.5}))
    alone = worker.submit(_job("run-a", "sample", _request([2, 7], True))).result(timeout=120)
    before = (worker.decodes, worker.mixed_decodes)
    jobs = [_job("full-run", "sample", _request([2, 7], True)), _job("run-a", "sample", _request([2, 7], True)),
            _job("no/such/checkpoint", "sample", _request([2, 7], True)), _job("run-b", "sample", _request([2, 7], True))]
    with worker._ready:
        futures = [worker.submit(j) for j in jobs]
    full, lora_a, _, _ = [f.result(timeout=120) if i != 2 else None for i, f in enumerate(futures)]
    with pytest.raises(Exception, match="no/such/checkpoint"):
        futures[2].result(timeout=120)
    assert worker.decodes == before[0] + 2  # full weights alone; run-a and run-b together (the failed load skipped)
    assert worker.mixed_decodes == before[1] + 1 and worker.last_batch_keys == frozenset({"run-a", "run-b"})
    assert full.sequences[0].tokens != lora_a.sequences[0].tokens
    _same(lora_a, alone)


def test_without_fuse_runs_each_decode_holds_one_adapter(service):
    """``fuse_runs=False`` (the library's default, ``--no-fuse-runs``): adapters queued together
    decode one at a time, as before issue 43, with the same tokens."""
    worker = _pinned(service)
    assert not worker.mix
    keys = ["run-a", "run-b", "run-c"]
    alone = [worker.submit(_job(key, "sample", _request([1, 2, 3, 4], True))).result(timeout=120) for key in keys]
    before = (worker.decodes, worker.mixed_decodes)
    results = _queued_together(worker, [_job(key, "sample", _request([1, 2, 3, 4], True)) for key in keys])
    assert (worker.decodes, worker.mixed_decodes) == (before[0] + 3, before[1])  # one decode per adapter, none mixed
    for got, want in zip(results, alone):
        _same(got, want)


def test_stacked_products_equal_each_adapter_alone_by_hand():
    """The lean decode's batched per-row LoRA (two ``bmm`` a site for all adapters) against each
    row's ``x + (x A^T)(s B)^T`` by hand: different ranks (zero-padded), an adapter without MLP
    sites, base rows, interleaved rows (gathered) and groups of different sizes (padded slots)."""
    from rlkit.backends.local.row_lora import PackedAdapter, RowLora, StackedSites

    hidden, inter = 8, 12
    widths = {"q_proj": 8, "k_proj": 4, "v_proj": 4, "o_proj": hidden, "gate_proj": inter, "up_proj": inter, "down_proj": hidden}
    ins = {"q_proj": hidden, "k_proj": hidden, "v_proj": hidden, "o_proj": hidden, "gate_proj": hidden, "up_proj": hidden, "down_proj": inter}
    parent = {n: "self_attn" if n in PROJECTIONS[:4] else "mlp" for n in PROJECTIONS}
    g = torch.Generator().manual_seed(3)
    raw = {}
    for name, rank, names in (("a", 2, PROJECTIONS), ("b", 4, PROJECTIONS[:4]), ("c", 3, PROJECTIONS)):
        raw[name] = {f"model.layers.0.{parent[n]}.{n}": (torch.randn(rank, ins[n], generator=g), torch.randn(widths[n], rank, generator=g), 0.5)
                     for n in names}
    packed = {k: PackedAdapter(v, torch.device("cpu"), torch.float32, [("model.layers.0", widths)]) for k, v in raw.items()}
    sites = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj"), "o": ("o_proj",), "down": ("down_proj",)}
    for layout in (["a", "a", "b", "b", "c", "c"], ["a", "b", None, "a", "c", "b", "a"]):
        lora = RowLora([packed[k] if k else None for k in layout], torch.device("cpu"), StackedSites)
        assert lora.stacked is not None
        for site, names in sites.items():
            x = torch.randn(len(layout), ins[names[0]], generator=g)
            out = torch.randn(len(layout), sum(widths[n] for n in names), generator=g)
            want = out.clone()
            for i, key in enumerate(layout):
                parts = []
                for n in names:
                    pair = raw[key].get(f"model.layers.0.{parent[n]}.{n}") if key else None
                    parts.append(torch.zeros(widths[n]) if pair is None else (x[i] @ pair[0].T) @ (pair[1] * pair[2]).T)
                want[i] += torch.cat(parts)
            torch.testing.assert_close(lora.add_site(out, x, 0, site), want, atol=1e-5, rtol=1e-5)
