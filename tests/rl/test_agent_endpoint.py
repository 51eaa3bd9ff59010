"""Agents written against the ``openai`` client train through rlkit's rollout endpoint: each call's
exact prompt / sampled tokens / logprobs are recorded per episode, a turn that does not extend the
previous tokens starts a new sequence, the datums' tokens are the recorded tokens, a raising agent
fails only its episode (counted), and ``rlkit train`` runs the cookbook's tool-using agent."""

import json
import math
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
    """Two turns with its own prompts; fails on purpose when the problem says so."""
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": problem["question"]}]
    reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    if problem.get("explode"):
        raise RuntimeError("agent bug")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Again, shorter."}]
    reply = client.chat.completions.create(model=model, messages=messages).choices[0].message.content
    return float(len(reply) % 3)


def test_agent_episodes_train_with_exact_tokens_and_a_raising_agent_is_counted(service, sampler, monkeypatch):
    from rlkit.rl.agents import AgentTask

    records = []
    close = RolloutEndpoint.close
    monkeypatch.setattr(RolloutEndpoint, "close", lambda self, eid: records.append(close(self, eid)) or records[-1])
    task = AgentTask(agent=counting_agent, task={"name": "arithmetic", "num_train": 4, "num_test": 1})
    tokenizer = sampler.get_tokenizer()
    try:
        problems = task.problems("train")[:2]
        groups = [task.env_group(problems[0], tokenizer), task.env_group({**problems[1], "explode": True}, tokenizer)]
        out = collect_groups(sampler, groups, 3, PARAMS, RolloutPolicy(), seeds=[1, 2])
    finally:
        task.close()
    ok, broken = out
    assert ok.failed == 0 and len(ok.trajectories) == 3 and broken.failed == 3  # the run goes on
    assert all(t.failed and "agent bug" in t.failure for t in broken.trajectories)
    assert broken.rewards == [0.0, 0.0, 0.0]  # on_failure=zero
    assert all(t.metrics["agent/failed"] == 1.0 for t in broken.trajectories)
    assert len(records) == 6 and sorted(len(r.calls) for r in records) == [1, 1, 1, 2, 2, 2]
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


def test_rlkit_train_runs_the_cookbook_tool_agent(tmp_path, monkeypatch):
    from rlkit import cli

    monkeypatch.syspath_prepend(str(AGENTS))
    run = tmp_path / "run"
    code = cli.main(["train", "recipe=agent_grpo_smoke", "logger.console=false", f"run_dir={run}"])
    assert code == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "rollout/failed" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["rollout/failed"] == 0 and m["reward/agent/calls"] >= 1
        assert math.isfinite(m.get("train/grad_norm", 0.0))
    assert any(m.get("tokens/trained", 0) > 0 for m in steps)


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
