"""The front door written once (rlkit.engine): every engine's sampling and service clients inherit
their checks, so a backend that implements only the primitives gets the contract's refusals for
free — and every engine refuses a ``create_sampling_client`` alike (local, vLLM here; Tinker and
SageMaker in tests/test_training_front_door.py)."""

import pytest

import rlkit
from rlkit.engine import Capabilities, SamplingClientBase, ServiceClientBase, TrainingClientBase
from rlkit.errors import ClientStoppedError, InvalidInputError
from rlkit.futures import APIFuture
from rlkit.types import ForwardBackwardOutput, ModelInput, SamplingParams

#: what every engine's ``create_sampling_client`` answers (the SageMaker SDK's rule: exactly one)
NOT_EXACTLY_ONE = "create_sampling_client: pass exactly one of base_model= or model_package_arn="


class Primitives(SamplingClientBase):
    """A backend with nothing but the primitives (records what reached them)."""

    max_samples = 4
    extensions = frozenset({"on_token"})

    def __init__(self):
        self.calls = []

    @property
    def capabilities(self):
        return Capabilities(engine="toy", builtin_losses={})

    @property
    def vocab_size(self):
        return 100

    @property
    def max_positions(self):
        return 8

    def get_tokenizer(self):
        raise AssertionError("only text prompts need the tokenizer")

    def _sample(self, tokens, num_samples, params, include_prompt_logprobs, topk_prompt_logprobs, **extensions):
        self.calls.append((tokens, num_samples, params, extensions))
        return "future"

    def _compute_logprobs(self, tokens):
        self.calls.append(("logprobs", tokens))
        return "future"


def test_checked_and_coerced_once_for_every_engine():
    client = Primitives()
    assert client.sample(ModelInput.from_ints([1, 2, 3]), 2, {"max_tokens": 5}, on_token=print) == "future"
    tokens, n, params, extensions = client.calls[0]
    assert tokens == [1, 2, 3] and n == 2 and params == SamplingParams(max_tokens=5) and "on_token" in extensions
    assert client.compute_logprobs([4, 5]) == "future" and client.calls[1] == ("logprobs", [4, 5])
    for bad, message in [
        (dict(prompt=[1, 200]), r"token id 200 is outside the vocabulary \[0, 100\)"),
        (dict(prompt=list(range(1, 9))), "context window is 8"),
        (dict(prompt=[1], num_samples=5), r"num_samples=5 must be an integer in \[1, 4\]"),
        (dict(prompt=[1], sampling_params={"max_tokenz": 3}), "max_tokenz"),
        (dict(prompt=[1], stop_token_ids=[2]), r"unexpected keyword\(s\) \['stop_token_ids'\].*takes \['on_token'\]"),
        (dict(prompt=[1], sampling_params={"constraint": {"regex": "a+"}}), "constrained decoding"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            client.sample(**bad)
    assert len(client.calls) == 2  # nothing refused reached the engine
    client.stop()
    with pytest.raises(ClientStoppedError):
        client.sample([1])


def test_a_polled_service_keeps_a_batch_of_calls_in_flight():
    """On SageMaker every call waits at least one ~2 s poll: the RL loop sends a step's groups (and
    an evaluation's problems) together even where the recipe asks for one at a time (issue 40.2)."""
    from rlkit.backends.local.clients import LOCAL_CAPABILITIES
    from rlkit.backends.sagemaker.capabilities import SAGEMAKER_CAPABILITIES

    assert SAGEMAKER_CAPABILITIES.polled_operations and not LOCAL_CAPABILITIES.polled_operations
    assert SAGEMAKER_CAPABILITIES.in_flight(1, 3) == 3  # raised to the batch
    assert SAGEMAKER_CAPABILITIES.in_flight(8, 3) == 8  # never lowered
    assert SAGEMAKER_CAPABILITIES.in_flight(0, 0) == 1
    assert LOCAL_CAPABILITIES.in_flight(1, 3) == 1  # in-process: the recipe's choice stands


class ToyService(ServiceClientBase):
    """An engine's service client with nothing but the sampling primitive (records what reached it)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def capabilities(self):
        return Capabilities(engine="toy", builtin_losses={})

    def _create_sampling_client(self, base_model, checkpoint):
        self.calls.append((base_model, checkpoint))
        return "sampler"


def sampling_refusals(service):
    """``(type, message)`` of each bad ``create_sampling_client`` call, then after ``close()``."""
    out = []
    for kwargs in ({}, {"base_model": ""}, {"model_package_arn": None}, {"base_model": "tiny", "model_package_arn": "x"},
                   {"base_model": 7}, {"model_package_arn": 7}):
        with pytest.raises(InvalidInputError) as info:
            service.create_sampling_client(**kwargs)
        out.append((type(info.value).__name__, str(info.value)))
    service.close()
    with pytest.raises(ClientStoppedError) as info:
        service.create_sampling_client(base_model="tiny")
    out.append((type(info.value).__name__, str(info.value)))
    return out


EXPECTED_REFUSALS = [("InvalidInputError", NOT_EXACTLY_ONE)] * 4 + [
    ("InvalidInputError", "create_sampling_client: base_model=7 must be a string"),
    ("InvalidInputError", "create_sampling_client: model_package_arn=7 must be a string"),
    ("ClientStoppedError", "this service client was closed"),
]


def test_create_sampling_client_is_checked_once_for_every_engine():
    """One check over the engine's primitive: exactly one of the two, strings, the client open;
    what passes reaches the engine as given (no engine picks a model of its own)."""
    toy = ToyService()
    assert toy.create_sampling_client(base_model="tiny") == "sampler"
    assert toy.create_sampling_client(model_package_arn="ckpt") == "sampler"
    assert toy.create_sampling_client(base_model="tiny", model_package_arn="") == "sampler"
    assert toy.calls == [("tiny", None), (None, "ckpt"), ("tiny", None)]
    assert sampling_refusals(toy) == EXPECTED_REFUSALS
    assert len(toy.calls) == 3  # nothing refused reached the engine


def test_local_and_vllm_refuse_a_sampling_client_alike(tmp_path):
    """The local engine (which fell back to a hard-coded model) and the vLLM sampler (its own
    default) refuse exactly as the base does; nothing is loaded or contacted to refuse."""
    local = rlkit.connect("local", checkpoint_dir=tmp_path / "local")
    vllm = rlkit.connect("local", sampler="vllm", vllm={"urls": ["http://127.0.0.1:9"], "check_model": False},
                         checkpoint_dir=tmp_path / "vllm")
    assert sampling_refusals(local) == EXPECTED_REFUSALS
    assert sampling_refusals(vllm) == EXPECTED_REFUSALS
    assert local._runtimes == {} and vllm._runtimes == {}  # no model was loaded


def test_the_older_homes_of_the_contract_still_import():
    """``rlkit.session``, ``rlkit.front_door`` and ``rlkit.backends`` re-export the contract's names
    from their home, ``rlkit.engine``."""
    import rlkit.engine as engine
    import rlkit.front_door as front_door
    import rlkit.session as session
    from rlkit.backends import BACKENDS, BackendSpec, backend_spec, register_backend

    for name in engine.__all__:
        assert getattr(session, name) is getattr(engine, name) is getattr(front_door, name), name
    assert (BACKENDS, BackendSpec, backend_spec, register_backend) == (engine.BACKENDS, engine.BackendSpec,
                                                                       engine.backend_spec, engine.register_backend)
    assert rlkit.connect is engine.connect and rlkit.register_backend is engine.register_backend


class ToyTrainer(TrainingClientBase):
    """An engine that computes the built-ins only (records what reached its primitives)."""

    def __init__(self, native_custom_losses=False):
        super().__init__("toy-1", "tiny")
        self.native = native_custom_losses
        self.calls = []

    @property
    def capabilities(self):
        from rlkit.losses.builtin import builtin_config_keys

        return Capabilities(engine="toy", builtin_losses=builtin_config_keys(), native_custom_losses=self.native)

    def _forward_backward(self, data, loss, **extensions):
        self.calls.append((data, loss, extensions))
        return APIFuture.completed(ForwardBackwardOutput(loss_fn_outputs=[], metrics={}))


@pytest.fixture
def counted(monkeypatch):
    """How often a loss is built from a name and how often a PPO validates a batch."""
    import rlkit.losses.builtin as builtin
    from rlkit.losses import PPO

    counts = {"built": 0, "validated": 0}
    build, validate = builtin.builtin_loss, PPO.validate

    def counting_build(*args, **kwargs):
        counts["built"] += 1
        return build(*args, **kwargs)

    def counting_validate(self, *args, **kwargs):
        counts["validated"] += 1
        return validate(self, *args, **kwargs)

    monkeypatch.setattr(builtin, "builtin_loss", counting_build)
    monkeypatch.setattr(PPO, "validate", counting_validate)
    return counts


def test_the_engine_receives_the_loss_built_and_validated_once(counted):
    """A named built-in is built and validated once, and that object reaches the engine, which
    reads the name and the config as given off it; a Loss object that is a built-in reaches it as
    it is, through ``run_loss`` too (issue 52.3)."""
    from helpers import rl_datum

    from rlkit.losses import PPO, run_loss
    from rlkit.losses.builtin import builtin_call

    batch = [rl_datum([1, 2, 3, 4], [-1.0, -1.0, -1.0, -1.0], 0.5)]
    trainer = ToyTrainer()
    trainer.forward_backward(batch, "ppo").result()
    trainer.forward_backward(batch, "ppo", loss_fn_config={"clip_high_threshold": 1.3}).result()
    assert counted == {"built": 2, "validated": 2}
    (_, first, _), (_, second, _) = trainer.calls
    assert type(first) is PPO and builtin_call(first) == ("ppo", None)  # no config: the engine's own defaults
    assert builtin_call(second) == ("ppo", {"clip_high_threshold": 1.3}) and second.clip_high_threshold == 1.3
    loss = PPO(clip_high_threshold=1.28)
    for engine in (ToyTrainer(), ToyTrainer(native_custom_losses=True)):
        run_loss(engine, batch, loss).result()
        engine.forward_backward(batch, loss).result()
        assert [call[1] for call in engine.calls] == [loss, loss]
    assert builtin_call(loss) == ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
    assert counted == {"built": 2, "validated": 6}  # nothing built again; each call validated once
