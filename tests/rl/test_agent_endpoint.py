"""Agents written against the ``openai`` client (sync ``openai.OpenAI`` or ``async def`` with
``openai.AsyncOpenAI``) train through rlkit's rollout endpoint: each call's exact prompt / sampled
tokens / logprobs are recorded per episode, a turn that does not extend the previous tokens starts a
new sequence, the datums' tokens are the recorded tokens, a raising agent fails only its episode
(counted in ``reward/agent/failed`` even before its first call), an async group's episodes run at
once on one event loop, a run whose every rollout fails stops with one line, and ``rlkit train``
runs the cookbook's tool-using agent, sync and async."""

import asyncio
import json
import math
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

import openai  # noqa: E402

from rlkit.chat import prompt_tokens  # noqa: E402
from rlkit.rl.collect import RolloutPolicy, collect_groups  # noqa: E402
from rlkit.rl.datums import trajectory_datums  # noqa: E402
from rlkit.serve.rollouts import EpisodeRecord, RecordedCall, RolloutEndpoint  # noqa: E402
from rlkit.types import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

AGENTS = Path(__file__).resolve().parents[2] / "cookbook" / "agents"
PARAMS = SamplingParams(max_tokens=6, temperature=1.0)


def test_calls_become_sequences_by_token_prefix():
    record = EpisodeRecord("e", PARAMS, [
        RecordedCall([1, 2, 3], [4, 5], [-0.1, -0.2]),
        RecordedCall([1, 2, 3, 4, 5, 6, 7], [8], [-0.3]),     # extends: observation [6, 7]
        RecordedCall([1, 2, 9, 6, 7, 8, 10], [11, 12], [-0.4, -0.5]),  # history re-rendered: a new sequence
    ])
    traj = record.trajectory()
    assert [t.observation for t in traj.transitions] == [[1, 2, 3], [6, 7], [1, 2, 9, 6, 7, 8, 10]]
    assert [t.new_sequence for t in traj.transitions] == [False, False, True]
    assert traj.sequences == [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9, 6, 7, 8, 10, 11, 12]]
    assert traj.transitions[-1].done and record.new_sequences == 1
    datums = trajectory_datums(traj, 1.0)
    assert [d.model_input.to_ints() for d in datums] == traj.sequences


@pytest.fixture(scope="module")
def sampler(service):
    return service.create_sampling_client(base_model="tiny")


@pytest.fixture(scope="module")
def endpoint():
    ep = RolloutEndpoint().start()
    yield ep
    ep.stop()


def test_endpoint_records_exact_tokens_with_the_runs_settings(endpoint, sampler):
    tokenizer = sampler.get_tokenizer()
    episode = endpoint.open(sampler, SamplingParams(max_tokens=5, temperature=1.0, seed=3))
    client = openai.OpenAI(base_url=endpoint.base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    first = client.chat.completions.create(model=episode, messages=messages, max_tokens=50, temperature=0.0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Sure?"}]
    second = client.chat.completions.create(model=episode, messages=messages, max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        client.chat.completions.create(model=episode, messages=messages, n=2)
    record = endpoint.close(episode)
    assert len(record.calls) == 2
    call = record.calls[0]
    assert call.prompt == prompt_tokens(tokenizer, messages[:1])  # exactly what the template renders
    assert len(call.tokens) == len(call.logprobs) == first.usage.completion_tokens <= 5  # the run's max_tokens caps the agent's 50
    assert all(lp <= 0 for lp in call.logprobs) and len(record.calls[1].tokens) <= 3
    assert tokenizer.decode(call.tokens, skip_special_tokens=True).startswith(first.choices[0].message.content[:3])
    assert second.model == episode
    with pytest.raises(openai.NotFoundError):  # a closed (or unknown) episode is refused
        client.chat.completions.create(model=episode, messages=messages)


def counting_agent(problem, *, base_url, model):
    """Two turns with its own prompts; fails on purpose when the problem says so (before or after its first call)."""
    if problem.get("explode_early"):
        raise RuntimeError("agent bug before any call")
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": problem["question"]}]
    reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    if problem.get("explode"):
        raise RuntimeError("agent bug")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again, shorter."}]
    reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    return float(len(reply) % 3)


IN_FLIGHT = {"now": 0, "max": 0, "threads": set()}


async def async_counting_agent(problem, *, base_url, model):
    """``counting_agent`` with ``openai.AsyncOpenAI``; notes how many episodes are in flight at once, and on which threads."""
    if problem.get("explode_early"):
        raise RuntimeError("agent bug before any call")
    IN_FLIGHT["now"] += 1
    IN_FLIGHT["max"] = max(IN_FLIGHT["max"], IN_FLIGHT["now"])
    IN_FLIGHT["threads"].add(threading.get_ident())
    try:
        async with openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0) as client:
            messages = [{"role": "user", "content": problem["question"]}]
            reply = (await client.chat.completions.create(model=model, messages=messages)).choices[0].message.content
            if problem.get("explode"):
                raise RuntimeError("agent bug")
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again, shorter."}]
            reply = (await client.chat.completions.create(model=model, messages=messages)).choices[0].message.content
            return float(len(reply) % 3)
    finally:
        IN_FLIGHT["now"] -= 1


@pytest.mark.parametrize("agent", [counting_agent, async_counting_agent], ids=["sync", "async"])
def test_agent_episodes_train_with_exact_tokens_and_a_raising_agent_is_counted(service, sampler, monkeypatch, agent):
    from rlkit.rl.agents import AgentTask
    from rlkit.rl.loop import _rollout_metrics
    from rlkit.rl.schedule import Batch

    records = []
    close = RolloutEndpoint.close
    monkeypatch.setattr(RolloutEndpoint, "close", lambda self, eid: records.append(close(self, eid)) or records[-1])
    task = AgentTask(agent=agent, task={"name": "arithmetic", "num_train": 4, "num_test": 1})
    assert task.is_async == (agent is async_counting_agent)
    tokenizer = sampler.get_tokenizer()
    IN_FLIGHT.update(max=0, threads=set())
    try:
        problems = task.problems("train")[:3]
        groups = [task.env_group(problems[0], tokenizer), task.env_group({**problems[1], "explode": True}, tokenizer),
                  task.env_group({**problems[2], "explode_early": True}, tokenizer)]
        out = collect_groups(sampler, groups, 3, PARAMS, RolloutPolicy(), seeds=[1, 2, 3], concurrency=1)
    finally:
        task.close()
    ok, broken, early = out
    assert ok.failed == 0 and len(ok.trajectories) == 3 and broken.failed == early.failed == 3  # the run goes on
    assert all(t.failed and "agent bug" in t.failure for t in broken.trajectories + early.trajectories)
    assert broken.rewards == early.rewards == [0.0, 0.0, 0.0]  # on_failure=zero
    assert all(t.metrics["agent/failed"] == 1.0 for t in broken.trajectories + early.trajectories)
    assert all(not t.transitions and t.metrics["agent/calls"] == 0.0 for t in early.trajectories)  # failed before its first call
    metrics = _rollout_metrics(Batch(groups=out, version=0), 0, 0)
    assert metrics["rollout/failed"] == 6 and metrics["reward/agent/failed"] == pytest.approx(6 / 9)  # every failure counted
    if agent is async_counting_agent:  # a group's episodes: at once, as tasks of one event loop (one thread per group)
        assert IN_FLIGHT["max"] == 3 and len(IN_FLIGHT["threads"]) <= 2
    assert len(records) == 9 and sorted(len(r.calls) for r in records) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    trained = [tuple(tok for d in trajectory_datums(t, 1.0) for tok in d.model_input.to_ints()) for t in ok.trajectories]
    recorded = [tuple(tok for seq in r.trajectory().sequences for tok in seq) for r in records if len(r.calls) == 2]
    assert sorted(trained) == sorted(recorded)
    for traj, r in zip(ok.trajectories, ok.rewards):
        assert len(traj.transitions) == 2 and traj.total_reward == r
        actions = [tok for t in traj.transitions for tok in t.action]
        assert any(actions == [tok for c in rec.calls for tok in c.tokens] for rec in records)
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8)
    try:
        datums = [d for t in ok.trajectories for d in trajectory_datums(t, 0.5, 1.0)]
        trainer.forward_backward(datums, "importance_sampling").result()
        grad_norm = trainer.optim_step().result().metrics["grad_norm"]
        assert math.isfinite(grad_norm) and grad_norm > 0
    finally:
        trainer.stop()


CANCELLED = []


async def slow_async_agent(problem, *, base_url, model):
    """Waits past the timeout: cooperatively (cancelled), or blocking its event loop."""
    if problem.get("block"):
        time.sleep(3)  # a blocking call inside async def: the loop cannot time it out
        return 1.0
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        CANCELLED.append(model)
        raise
    return 1.0


def test_an_async_agent_past_its_timeout_is_cancelled_and_one_blocking_its_loop_is_abandoned(sampler, monkeypatch):
    from rlkit.rl import agents

    monkeypatch.setattr(agents, "LOOP_GRACE_S", 0.5)
    task = agents.AgentTask(agent=slow_async_agent, task={"name": "arithmetic", "num_train": 2, "num_test": 1}, timeout_s=1.0)
    problems = task.problems("train")
    CANCELLED.clear()
    try:
        t0 = time.perf_counter()
        waits, = collect_groups(sampler, [task.env_group(problems[0], None)], 2, PARAMS, RolloutPolicy(), seeds=[1])
        assert time.perf_counter() - t0 < 1.0 + 0.5 + 1 and len(CANCELLED) == 2  # cancelled at timeout_s
        assert waits.failed == 2 and all("ran past task.timeout_s=1.0s" in t.failure for t in waits.trajectories)
        t0 = time.perf_counter()
        blocks, = collect_groups(sampler, [task.env_group({**problems[1], "block": True}, None)], 2, PARAMS, RolloutPolicy(), seeds=[1])
        assert time.perf_counter() - t0 < 1.0 + 0.5 + 1  # abandoned at timeout_s + grace, not after both blocking sleeps (6 s)
        assert blocks.failed == 2 and all("event loop was still busy" in t.failure for t in blocks.trajectories)
    finally:
        task.close()


def test_which_agents_are_awaited():
    import functools

    from rlkit.rl.agents import _call_sync, is_async_agent

    class AsyncCall:
        async def __call__(self, problem, *, base_url, model):
            return 1.0

    assert is_async_agent(async_counting_agent) and is_async_agent(AsyncCall()) and is_async_agent(functools.partial(slow_async_agent))
    assert not is_async_agent(counting_agent) and not is_async_agent(lambda problem, **kw: 1.0)
    hides_it = lambda problem, **kw: AsyncCall()(problem, **kw)  # noqa: E731 - a sync callable returning a coroutine
    assert not is_async_agent(hides_it) and _call_sync(hides_it, {}, base_url="", model="") == 1.0  # awaited on its thread


def always_raises(problem, *, base_url, model):
    raise RuntimeError("this agent always fails")


@pytest.mark.parametrize("agent", ["solve", "solve_async"])
def test_rlkit_train_runs_the_cookbook_tool_agent(tmp_path, monkeypatch, agent):
    from rlkit import cli

    monkeypatch.syspath_prepend(str(AGENTS))
    run = tmp_path / "run"
    code = cli.main(["train", "recipe=agent_grpo_smoke", "logger.console=false", f"run_dir={run}", f"train.task.agent=calculator_agent:{agent}"])
    assert code == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "rollout/failed" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/failed"] == 0 and m["reward/agent/calls"] >= 1
        assert math.isfinite(m.get("train/grad_norm", 0.0))
    assert any(m.get("tokens/trained", 0) > 0 for m in steps)


def test_a_run_whose_every_rollout_fails_stops_with_one_line(tmp_path, monkeypatch, capsys):
    from rlkit import cli

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as done:  # what `rlkit train` exits with
        cli.main(["train", "recipe=agent_grpo_smoke", "logger.console=false", f"run_dir={run}",
                  "train.task.agent=test_agent_endpoint:always_raises"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlkit: error")]
    assert done.value.code == 2 and len(err) == 1, err
    assert "step 0: every rollout failed (6 of 6)" in err[0] and "RuntimeError: this agent always fails" in err[0]
    assert "train.rollout.max_failed_steps=0" in err[0]


def test_a_requests_constraint_survives_the_runs_sampling_settings():
    """The endpoint samples with the run's temperature etc., but a forced tool call's or
    response_format's grammar is the request's own and must reach the sampler."""
    import threading

    from rlkit.serve.rollouts import EpisodeRecord, RecordingClient
    from rlkit.types import Constraint, SamplingParams

    seen = []

    class Capture:
        def sample(self, prompt, num_samples=1, sampling_params=None, **kwargs):
            seen.append(sampling_params)
            return None

    run = SamplingParams(max_tokens=16, temperature=1.0)
    client = RecordingClient(Capture(), EpisodeRecord("e1", run), threading.Lock())
    wanted = Constraint(json_schema={"type": "object"})
    coroutine = client.sample([1, 2, 3], sampling_params=SamplingParams(max_tokens=64, temperature=0.2, constraint=wanted))
    coroutine.close()  # the recording wrapper is not awaited here: only what reached the sampler matters
    assert seen[0].constraint == wanted and seen[0].temperature == 1.0 and seen[0].max_tokens == 16
