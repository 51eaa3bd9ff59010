"""``save_state`` on N ranks writes ``torch.distributed.checkpoint``'s sharded files (issue 42 item
3): each rank its own shard, atomic and checksummed like every local checkpoint, and the checkpoint
loads on any number of ranks — saved on 2 ranks (``torchrun``, gloo, the tiny model), it gives
identical logprobs and the same next optim_step on 4 ranks and in one plain process (no process
group). ``save_weights_for_sampler`` stays the gathered export, written by rank 0 alone.

One 2-rank launch saves (LoRA and full fine-tuning), one 4-rank launch resumes; the one-process
checks run in this process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from backends.ranks_worker import batch, logprobs, resumed

import rlkit
from rlkit.backends.local import checkpoints as ckpt
from rlkit.errors import CheckpointCorruptError

pytestmark = pytest.mark.slow  # subprocesses, servers, ranks or whole runs: outside the fast tier (-m 'not slow')

WORKER = Path(__file__).with_name("ranks_worker.py")
MODES = ["lora", "full"]


def _launch(nproc: int, out: Path, checkpoints: Path, previous: str, lean: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(WORKER),
               str(out), str(checkpoints), previous, lean]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dcp")
    two = _launch(2, tmp / "two.json", tmp / "ckpt2", "", "save")
    four = _launch(4, tmp / "four.json", tmp / "ckpt4", str(tmp / "two.json"), "resume")
    return two, four


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = rlkit.connect("local", precision="fp32", num_threads=1, activation_checkpointing=False,
                        checkpoint_dir=tmp_path_factory.mktemp("dcp1"))
    yield svc
    svc.close()


def _close(a, b):
    assert b["tokens"] == a["tokens"]
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=5e-5)
    for x, y in zip(a["logprobs"], b["logprobs"]):
        assert y == pytest.approx(x, abs=1e-4)


@pytest.mark.parametrize("mode", MODES)
def test_state_saved_on_two_ranks_is_dcp_shards_with_checksums_and_the_export_is_one_file(runs, mode):
    two = runs[0][mode]
    root = ckpt.resolve(two["checkpoint"])
    meta = ckpt.verify(two["checkpoint"])  # every file against its size and SHA-256
    assert meta["format"] == "dcp" and meta["world_size"] == 2 and meta["step"] == 1 and meta["kind"] == "state"
    assert meta["rank"] == (4 if mode == "lora" else 0)
    assert sorted(meta["files"]) == ["dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp"]  # a shard per rank
    assert sorted(p.name for p in root.iterdir()) == ["dcp", ckpt.META]  # nothing gathered: no adapter, no optimizer.pt
    assert not list(root.parent.glob(".*tmp-*"))  # sealed: no temporary directory left
    export = ckpt.resolve(two["export"])
    wanted = [ckpt.ADAPTER, ckpt.ADAPTER_CONFIG] if mode == "lora" else [ckpt.WEIGHTS, ckpt.MODEL_CONFIG]
    assert set(wanted) <= {p.name for p in export.iterdir()} and not (export / "dcp").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_saved_on_two_ranks_loads_on_four(runs, mode):
    two, four = runs[0][mode], runs[1][mode]
    assert four["digest"] == two["digest"]  # resharded 2 -> 4: the same weights, bit for bit
    for a, b in zip(two["saved_logprobs"], four["saved_logprobs"]):  # each row run in another rank's micro-batch
        assert b == pytest.approx(a, abs=1e-5)
    _close(two["next"], four["next"])  # and the same optimizer state: the next step as on 2 ranks


@pytest.mark.parametrize("mode", MODES)
def test_a_checkpoint_saved_on_two_ranks_loads_in_one_process(runs, service, mode):

    two = runs[0][mode]
    one = resumed(service, two["checkpoint"])  # no process group in this process
    assert one["digest"] == two["digest"]  # the same weights, bit for bit
    for a, b in zip(two["saved_logprobs"], one["saved_logprobs"]):
        assert b == pytest.approx(a, abs=1e-5)
    _close(two["next"], one["next"])
    # a sampler reads the sharded checkpoint's weights whole: the same logprobs as from the export
    tokens = [5, 17, 33, 81, 120, 7, 9]
    from_state = service.create_sampling_client(model_package_arn=two["checkpoint"]).compute_logprobs(tokens).result()
    from_export = service.create_sampling_client(model_package_arn=two["export"]).compute_logprobs(tokens).result()
    assert from_state == from_export


def test_a_damaged_shard_is_refused_naming_it_and_changes_nothing(runs, service, tmp_path):

    source = ckpt.resolve(runs[0]["lora"]["checkpoint"])
    damaged = tmp_path / source.name
    shutil.copytree(source, damaged)
    shard = damaged / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-100:-90] = bytes(10)
    shard.write_bytes(bytes(data))
    trainer = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=0)
    before = logprobs(trainer, batch())
    with pytest.raises(CheckpointCorruptError, match=r"dcp/__1_0\.distcp does not match its SHA-256") as err:
        trainer.load_state_with_optimizer(ckpt.checkpoint_id(damaged)).result()
    assert err.value.file == "dcp/__1_0.distcp"
    assert logprobs(trainer, batch()) == before
    with pytest.raises(CheckpointCorruptError, match=r"dcp/__1_0\.distcp"):
        service.create_sampling_client(model_package_arn=ckpt.checkpoint_id(damaged))
    trainer.stop()


def test_vllm_refuses_a_sharded_checkpoint_in_one_line_and_samples_its_export(runs, tmp_path):
    """vLLM loads PEFT adapter files: a DCP ``save_state`` checkpoint is refused before any
    request, naming the export to sample from instead (against the in-test vLLM stub)."""
    from backends.vllm_stub import Stub

    from rlkit.errors import InvalidInputError
    from rlkit.types import SamplingParams

    stub = Stub("tiny")
    svc = rlkit.connect("local", sampler="vllm", vllm={"urls": [stub.url], "check_model": False}, precision="fp32",
                        checkpoint_dir=tmp_path / "ckpt")
    try:
        with pytest.raises(InvalidInputError, match=r"sharded over 2 ranks \(DCP\).*save_weights_for_sampler"):
            svc.create_sampling_client(model_package_arn=runs[0]["lora"]["checkpoint"])
        assert not stub.requests
        sampler = svc.create_sampling_client(model_package_arn=runs[0]["lora"]["export"])
        assert sampler.sample([5, 6], sampling_params=SamplingParams(max_tokens=2)).result().sequences
    finally:
        svc.close()
        stub.close()
