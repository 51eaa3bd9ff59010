"""The fusing scheduler (rlkit.backends.local.fusion): several sessions of one
``LocalServiceClient(fuse_runs=True)`` share one training thread; their concurrent ``forward`` /
``forward_backward`` run as one pass through per-row LoRA, and each session's numbers equal those
it gets alone (tolerances of multi_lora.py: logprobs 1e-5, gradients 1e-4 relative, weights after
an AdamW step within 1 % of the learning rate). A failing run fails alone; sessions are served
round-robin; each session's operations run in its submission order.

A *gate* (an operation of a fourth session that blocks the worker until released) makes the
passes deterministic: everything submitted while it holds is queued, and the passes that follow
are the scheduler's choice alone."""

import threading

import pytest
import torch

import rlkit
from helpers import THREE_RUNS, THREE_RUNS_LOSSES, rl_datum, sft_datum, three_runs_data
from rlkit.errors import InvalidInputError
from rlkit.types import AdamParams

RUNS = THREE_RUNS
PROMPT = [1] + list(range(100, 109))  # 10 tokens: under the engine's 16-token shared prompt, so b's group fuses
SHARED = [1] + list(range(100, 117))  # 18 tokens: a group the engine runs with its prompt once
LOSSES = THREE_RUNS_LOSSES


def data_of(key):
    return three_runs_data(key, PROMPT)


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    svc = rlkit.connect("local", precision="fp32", checkpoint_dir=tmp_path_factory.mktemp("fused"), fuse_runs=True)
    yield svc
    svc.close()


def sessions(svc):
    """One session per run, B made non-zero (same values on every service) so every gradient is."""
    out = {}
    for key, (rank, alpha, seed) in RUNS.items():
        client = svc.create_lora_training_client("tiny", rank=rank, alpha=alpha, seed=seed)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _a, b, _s in client._engine.lora_modules().values():
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
        out[key] = client
    return out


def grads(client):
    return {n: p.grad.clone() for n, p in client._engine.named_trainable}


def weights(client):
    return {n: p.detach().clone() for n, p in client._engine.named_trainable}


class Gate:
    """Blocks the fused worker (an operation of its own session) until :meth:`open`."""

    def __init__(self, svc):
        self.client = svc.create_lora_training_client("tiny", rank=2, alpha=4)
        self.worker = svc._runtime("tiny").trainer
        self._release, entered = threading.Event(), threading.Event()
        self.future = self.client._submit(lambda: (entered.set(), self._release.wait(120)), "gate")
        assert entered.wait(120), "the gate never ran"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.open()

    def open(self):
        if self._release.is_set():
            return
        self._release.set()
        self.future.result(timeout=120)
        self.client.stop()

    def passes_after(self):
        """The passes recorded after the gate's: ``[(leader, [(session, operation)], fused)]``."""
        recent = list(self.worker.recent)
        start = max(i for i, r in enumerate(recent) if r.members == [(self.client.name, "gate")])
        return recent[start + 1:]


def test_concurrent_runs_fuse_and_equal_each_run_alone(fused, service):
    """Three sessions' forward and forward_backward, queued together: two fused passes (all three
    forwards, then all three forward_backwards); each session's logprobs, loss, gradients, token
    count and weights after its own optim_step equal the same session run alone."""
    solo, mine = sessions(service), sessions(fused)
    alone = {}
    for key, client in solo.items():
        fwd = client.forward(data_of(key), LOSSES[key]).result()
        fb = client.forward_backward(data_of(key), LOSSES[key]).result()
        alone[key] = (fwd, fb, grads(client), client._engine.pending_grad_tokens)
    worker = fused._runtime("tiny").trainer
    before = worker.stats.fused_passes
    with Gate(fused) as gate:
        futures = {key: (c.forward(data_of(key), LOSSES[key]), c.forward_backward(data_of(key), LOSSES[key])) for key, c in mine.items()}
    results = {key: (f.result(timeout=120), fb.result(timeout=120)) for key, (f, fb) in futures.items()}
    passes = gate.passes_after()
    assert [p.fused for p in passes[:2]] == [True, True] and worker.stats.fused_passes == before + 2
    names = {c.name: k for k, c in mine.items()}
    assert sorted((names[s], op) for s, op in passes[0].members) == [("a", "forward"), ("b", "forward"), ("c", "forward")]
    assert sorted(names[s] for s, op in passes[1].members if op == "forward_backward") == ["a", "b", "c"]
    params = AdamParams(learning_rate=1e-2)
    for key, client in mine.items():
        fwd, fb, alone_grads, alone_tokens = alone[key]
        for got, want in zip(results[key], (fwd, fb)):
            for x, y in zip(got.loss_fn_outputs, want.loss_fn_outputs):
                torch.testing.assert_close(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5, rtol=0)
            assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
        got_grads = grads(client)
        assert got_grads.keys() == alone_grads.keys()
        for name, g in alone_grads.items():
            assert g.abs().max() > 0, name
            torch.testing.assert_close(got_grads[name], g, rtol=1e-4, atol=1e-7)
        assert client._engine.pending_grad_tokens == alone_tokens
        start = weights(client)
        for c in (client, solo[key]):
            c.optim_step(params).result(timeout=120)
        for (name, p), (_, q) in zip(client._engine.named_trainable, solo[key]._engine.named_trainable):
            assert (p - start[name]).abs().max() > 1e-3, name
            torch.testing.assert_close(p, q, atol=1e-2 * params.learning_rate, rtol=0)
    keys = {c._worker.key for c in mine.values()}
    for client in [*mine.values(), *solo.values()]:
        client.stop()
    assert not keys & set(worker.model.adapters)  # a stopped session's adapter leaves the fused model


def test_a_failing_run_fails_only_its_own_future(fused, service):
    """A non-finite loss in one run of a fused pass fails its future and leaves its gradient as it
    was; the other runs' results and gradients are those they get alone."""
    mine = sessions(fused)
    solo = service.create_lora_training_client("tiny", rank=RUNS["c"][0], alpha=RUNS["c"][1], seed=RUNS["c"][2])
    with torch.no_grad():
        for (_, p), (_, q) in zip(solo._engine.named_trainable, mine["c"]._engine.named_trainable):
            p.copy_(q)
    solo.forward_backward(data_of("c"), "cross_entropy").result()
    bad = sft_datum([1, 40, 41, 2])
    bad.loss_fn_inputs["weights"] = [3e38] * 4  # finite inputs (checked at the call), a loss that overflows to inf
    with Gate(fused) as gate:
        futures = {"a": mine["a"].forward_backward([bad], "cross_entropy"),
                   "b": mine["b"].forward_backward(data_of("b"), "ppo"),
                   "c": mine["c"].forward_backward(data_of("c"), "cross_entropy")}
    with pytest.raises(InvalidInputError, match="not finite"):
        futures["a"].result(timeout=120)
    assert futures["b"].result(timeout=120).metrics["tokens:train"] == sum(d.model_input.length for d in data_of("b"))
    futures["c"].result(timeout=120)
    assert gate.passes_after()[0].fused and len(gate.passes_after()[0].members) == 3
    assert all(p.grad is None for _, p in mine["a"]._engine.named_trainable) and mine["a"]._engine.pending_grad_tokens == 0
    for name, g in grads(solo).items():
        torch.testing.assert_close(grads(mine["c"])[name], g, rtol=1e-4, atol=1e-7)
    mine["a"].forward_backward(data_of("a"), "cross_entropy").result(timeout=120)  # the failed session goes on
    for client in [*mine.values(), solo]:
        client.stop()


def test_round_robin_and_submission_order(fused):
    """A session that queued six operations does not delay another session's one by more than one
    pass; every session's operations run in its submission order, fusable or not."""
    busy = fused.create_lora_training_client("tiny", rank=2, alpha=4, seed=1)
    quiet = fused.create_lora_training_client("tiny", rank=4, alpha=8, seed=2)
    ops = [("forward_backward", lambda: busy.forward_backward(data_of("a"), "cross_entropy")),
           ("gradient_norm", busy.gradient_norm),
           ("optim_step", lambda: busy.optim_step(AdamParams(learning_rate=1e-3))),
           ("forward", lambda: busy.forward(data_of("a"), "cross_entropy")),
           ("forward_backward", lambda: busy.forward_backward(data_of("c"), "cross_entropy")),
           ("gradient_norm", busy.gradient_norm)]
    with Gate(fused) as gate:
        futures = [make() for _, make in ops]
        late = quiet.gradient_norm()  # submitted after all of busy's
    assert late.result(timeout=120) == 0.0
    for f in futures:
        f.result(timeout=120)
    passes = gate.passes_after()
    position = next(i for i, p in enumerate(passes) if (quiet.name, "gradient_norm") in p.members)
    assert position <= 1, passes  # first-in-first-out would run it seventh
    served = [op for p in passes for s, op in p.members if s == busy.name]
    assert served == [name for name, _ in ops]
    for client in (busy, quiet):
        client.stop()


def test_a_leader_waits_for_its_peers_within_the_window_and_a_lone_one_runs_after_it():
    """Peers in one loop (they fused last round) fuse again though their requests arrive 0.15 s
    apart, one op per session a pass, and the leader stops waiting as soon as the last peer joined;
    a session whose peers stopped coming waits the window once, then runs alone."""
    import time

    svc = rlkit.connect("local", precision="fp32", fuse_runs=True)
    try:
        clients = {k: svc.create_lora_training_client("tiny", rank=2, alpha=4, seed=i) for i, k in enumerate("abc")}
        worker = svc._runtime("tiny").trainer
        worker.window_s = 1.5  # the floor: far above the tiny model's passes, so the test sees the rule, not noise

        def fb(key):
            return clients[key].forward_backward(data_of(key), LOSSES[key])

        def last_pass():
            return [r for r in worker.recent if r.members[0][1] == "forward_backward"][-1]

        with Gate(svc):  # round 1: queued together, one pass (the peers are now known)
            first = [fb(k) for k in "abc"]
        for f in first:
            f.result(timeout=120)
        assert last_pass().fused and len(last_pass().members) == 3
        t0 = time.monotonic()
        second = [fb("a")]  # round 2: staggered arrivals, far beyond the old fixed 20 ms
        time.sleep(0.15)
        second += [fb("b"), fb("b")]  # b's second op waits for the next pass: one op per session a pass
        time.sleep(0.15)
        second.append(fb("c"))
        for f in second:
            f.result(timeout=120)
        last = [r for r in worker.recent if r.members[0][1] == "forward_backward"][-2]
        assert last.fused and sorted(s for s, _ in last.members) == sorted(c.name for c in clients.values()), last
        assert last_pass().members == [(clients["b"].name, "forward_backward")]
        assert last.spread_s >= 0.25 and time.monotonic() - t0 < 1.5 + 5  # it ran once c joined, not at the window's end
        t0 = time.monotonic()
        fb("a").result(timeout=120)  # b and c stopped: a waits the window once, then runs alone
        waited = time.monotonic() - t0
        assert last_pass().members == [(clients["a"].name, "forward_backward")] and waited >= 1.5, waited
    finally:
        svc.close()


def test_a_group_sharing_its_prompt_fuses_with_its_prompt_once_and_equals_its_run_alone(fused, service):
    """A GRPO group whose prompt the engine runs once (18 shared tokens) fuses with plain rows of
    the other sessions: the fused pass packs it as one row, its prompt once (multi_lora.plan_units:
    18 + 4 + 3 + 6 tokens, not 3 x 18 + 13), and its logprobs, loss and gradients are those of its
    session alone (through its engine's own layout, rlkit.backends.local.layout)."""
    from rlkit.backends.local import packed
    from rlkit.backends.local.multi_lora import RunWork, plan_units
    from rlkit.losses.registry import build_loss

    group = [rl_datum(SHARED + c, [-1.5] * (len(SHARED) + len(c)), adv, prompt_len=len(SHARED))
             for c, adv in (([60, 61, 62, 2], 1.0), ([70, 71, 2], -0.5), ([80, 81, 82, 83, 84, 2], 0.25))]
    (batch,) = plan_units([RunWork("b", group, build_loss("ppo"))], 2048)
    assert [packed.packed_len(unit) for _, unit in batch] == [18 + 4 + 3 + 6]
    solo, mine = sessions(service), sessions(fused)
    ops = {"a": (data_of("a"), "cross_entropy"), "b": (group, "ppo"), "c": (data_of("c"), "cross_entropy")}
    alone = {}
    for key, client in solo.items():
        alone[key] = (client.forward_backward(*ops[key]).result(timeout=120), grads(client))
    with Gate(fused) as gate:
        futures = {key: mine[key].forward_backward(*ops[key]) for key in ops}
    results = {key: f.result(timeout=120) for key, f in futures.items()}
    names = {c.name: k for k, c in mine.items()}
    passes = [(p.fused, sorted(names[s] for s, op in p.members)) for p in gate.passes_after()
              if any(op == "forward_backward" for _, op in p.members)]
    assert passes == [(True, ["a", "b", "c"])]
    for key, client in mine.items():
        want, want_grads = alone[key]
        for x, y in zip(results[key].loss_fn_outputs, want.loss_fn_outputs):
            torch.testing.assert_close(x["logprobs"].to_torch(), y["logprobs"].to_torch(), atol=1e-5, rtol=0)
        assert results[key].metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
        got = grads(client)
        for name, g in want_grads.items():
            assert g.abs().max() > 0, name
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=1e-7)
    for client in solo.values():
        client.stop()
    for client in mine.values():
        client.stop()


def test_a_group_whose_packed_row_costs_more_runs_alone_on_its_engine(fused):
    """A fused pass is packed (multi_lora.fused_run); a group whose completions are long enough that
    its packed row's attention outweighs the packing (rlkit.backends.local.layout) is not offered
    to one: it runs alone, in its engine's two passes, while the other runs still fuse."""
    mine = sessions(fused)
    long_group = [rl_datum(SHARED + [60 + k] * 200 + [2], [-1.5] * (len(SHARED) + 201), adv, prompt_len=len(SHARED))
                  for k, adv in enumerate((1.0, -0.5, 0.25))]
    assert not mine["b"]._engine.packed_pays(long_group)
    ops = {"a": (data_of("a"), "cross_entropy"), "b": (long_group, "ppo"), "c": (data_of("c"), "cross_entropy")}
    with Gate(fused) as gate:
        futures = {key: mine[key].forward_backward(*ops[key]) for key in ops}
    for f in futures.values():
        f.result(timeout=120)
    names = {c.name: k for k, c in mine.items()}
    passes = sorted((p.fused, sorted(names[s] for s, op in p.members)) for p in gate.passes_after()
                    if any(op == "forward_backward" for _, op in p.members))
    assert passes == [(False, ["b"]), (True, ["a", "c"])]
    assert mine["b"]._engine.packed_last is False
    for client in mine.values():
        client.stop()
