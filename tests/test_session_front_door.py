"""The front door written once (rlkit.session): every engine's sampling client inherits its checks,
so a backend that implements only the primitives gets the contract's refusals for free."""

import pytest

from rlkit.errors import ClientStoppedError, InvalidInputError
from rlkit.session import Capabilities, SamplingClientBase
from rlkit.types import ModelInput, SamplingParams


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
