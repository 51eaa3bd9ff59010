"""The emulator is recognised by its handshake (or ``backend.emulator=true``), never by the endpoint
variable alone: the SDK documents ``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` for interface VPC
endpoints, and a user on PrivateLink must get SageMaker's behaviour (a real role, their own
credentials, the Region's base models), not the emulator's placeholders."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import sft_datum
from sm_support import emulator_env, require_sdk, running_emulator

require_sdk()

from rlkit.backends.sagemaker.adapter import SageMakerServiceClient, answers_handshake  # noqa: E402
from rlkit.errors import ConfigError  # noqa: E402


class _NotTheEmulator(BaseHTTPRequestHandler):
    """Stands in for a VPC endpoint: every request, the health route too, is refused."""

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's name
        body = b'{"message": "Missing Authentication Token"}'
        self.send_response(403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture()
def vpc_endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotTheEmulator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_emulator_is_recognised_by_its_handshake(tmp_path):
    with running_emulator(tmp_path) as emu:
        assert answers_handshake(emu.url)
        svc = SageMakerServiceClient(handle_signals=False)  # no role, no Region: the emulator's placeholders
        assert svc.emulated and svc.role_arn.endswith(":role/rlkit-emulator")
        assert "tiny" in svc.list_base_models()
        trainer = svc.create_lora_training_client("tiny", rank=4, alpha=8)
        assert trainer.forward([sft_datum([1, 2, 3, 4], prompt_len=1)]).result(timeout=60).metrics["tokens:train"] == 4
        svc.close()
        # told it is not the emulator, the same endpoint is treated as SageMaker
        real = SageMakerServiceClient(emulator=False, handle_signals=False)
        assert not real.emulated
        with pytest.raises(ConfigError, match="backend.role_arn is required to create"):
            real.create_lora_training_client("tiny")
        real.close()


def test_an_endpoint_that_is_not_the_emulator_is_sagemaker(vpc_endpoint):
    assert not answers_handshake(vpc_endpoint)
    with emulator_env(vpc_endpoint):
        svc = SageMakerServiceClient(handle_signals=False)
        assert not svc.emulated and svc.role_arn is None
        assert svc.resolve_base_model("tiny") == "tiny"  # rlkit's local names mean nothing on SageMaker
        with pytest.raises(ConfigError, match="backend.role_arn is required to create"):
            svc.create_lora_training_client("tiny")
        svc.close()
        told = SageMakerServiceClient(emulator=True, handle_signals=False)  # an explicit backend.emulator=true
        assert told.emulated and told.resolve_base_model("tiny").endswith("/rlkit-tiny-random-llama/1.0.0")
        told.close()
    with pytest.raises(ConfigError, match="backend.emulator=true needs the emulator's URL"):
        SageMakerServiceClient(emulator=True, region="us-west-2", handle_signals=False)
