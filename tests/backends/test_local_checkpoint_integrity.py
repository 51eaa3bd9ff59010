"""Checkpoints prove themselves: every file's size and SHA-256 are recorded when it is written, a
load verifies them, a bad file raises CheckpointCorruptError naming it, and a load either fully
succeeds or changes nothing."""

import hashlib
import json
import shutil

import pytest
import torch
from helpers import adapter_state, same_state, sft_datum

from rlkit.backends.local import checkpoints as ckpt
from rlkit.errors import CheckpointCorruptError, CheckpointNotFoundError, InvalidInputError
from rlkit.types import AdamParams

DATA = [sft_datum([1, 40, 41, 42, 43, 2], prompt_len=2), sft_datum([1, 50, 51, 52, 2], prompt_len=2)]


def train(client, steps):
    for _ in range(steps):
        client.forward_backward(DATA)
        client.optim_step(AdamParams(learning_rate=2e-2))
    client.forward(DATA).result()


@pytest.fixture(scope="module")
def saved(service, tmp_path_factory):
    """A save_state checkpoint after 2 steps; tests corrupt copies of it."""
    client = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=3)
    try:
        train(client, 2)
        return ckpt.resolve(client.save_state("integrity").result().model_package_arn)
    finally:
        client.stop()


@pytest.fixture()
def copy_of(saved, tmp_path):
    """A fresh copy of the saved checkpoint directory, and its id."""
    path = tmp_path / "copy"
    shutil.copytree(saved, path)
    return path, ckpt.checkpoint_id(path)


def overwrite_near_end(path, n=3072):
    data = bytearray(path.read_bytes())
    start = max(len(data) - n - 16, 0)
    data[start : start + n] = bytes((b + 0x5A) % 256 for b in data[start : start + n])
    path.write_bytes(bytes(data))


def test_metadata_records_every_file_size_and_sha256(saved):
    meta = json.loads((saved / ckpt.META).read_text())
    names = {p.name for p in saved.iterdir() if p.name != ckpt.META}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt"} <= names
    assert set(meta["files"]) == names
    for name, record in meta["files"].items():
        data = (saved / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert meta["meta_sha256"] == ckpt._meta_digest(meta)
    assert ckpt.verify(ckpt.checkpoint_id(saved))["kind"] == "state"


def test_overwritten_adapter_is_refused_naming_the_file(service, copy_of):
    path, cid = copy_of
    overwrite_near_end(path / "adapter_model.safetensors")
    with pytest.raises(CheckpointCorruptError, match="adapter_model.safetensors does not match its SHA-256") as info:
        service.create_training_client_from_state(cid)
    assert info.value.file == "adapter_model.safetensors" and info.value.checkpoint == cid
    with pytest.raises(CheckpointCorruptError, match="adapter_model.safetensors"):
        service.create_sampling_client(model_package_arn=cid)
    with pytest.raises(CheckpointCorruptError, match="adapter_model.safetensors"):
        ckpt.verify(cid)
    assert not service.list_sessions()  # the session created for the load was stopped


@pytest.mark.parametrize("name", ["adapter_model.safetensors", "optimizer.pt", "adapter_config.json"])
def test_truncated_file_is_refused_naming_it(service, copy_of, name):
    path, cid = copy_of
    full = (path / name).read_bytes()
    (path / name).write_bytes(full[: len(full) // 2])
    with pytest.raises(
        CheckpointCorruptError, match=rf"{name} is truncated: {len(full) // 2} bytes, {len(full)} when written"
    ):
        ckpt.verify(cid)
    if name != "adapter_config.json":
        with pytest.raises(CheckpointCorruptError, match=name):
            service.create_training_client_from_state_with_optimizer(cid)


def test_missing_optimizer_is_corrupt_not_weights_only(service, copy_of):
    path, cid = copy_of
    (path / "optimizer.pt").unlink()
    with pytest.raises(CheckpointCorruptError, match="optimizer.pt is missing") as info:
        service.create_training_client_from_state_with_optimizer(cid)
    assert "weights only" not in str(info.value)


def test_missing_adapter_is_refused(service, copy_of):
    path, cid = copy_of
    (path / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointCorruptError, match="adapter_model.safetensors is missing"):
        service.create_training_client_from_state(cid)


@pytest.mark.parametrize("damage", ["truncated", "edited", "missing"])
def test_damaged_metadata_is_refused_naming_it(service, copy_of, damage):
    path, cid = copy_of
    meta_file = path / ckpt.META
    if damage == "truncated":
        meta_file.write_text(meta_file.read_text()[:40])
    elif damage == "edited":  # still valid JSON, one value changed
        meta_file.write_text(meta_file.read_text().replace('"step": 2', '"step": 9'))
    else:
        meta_file.unlink()
    with pytest.raises(CheckpointCorruptError, match=ckpt.META):
        service.create_training_client_from_state(cid)


def test_a_directory_that_never_was_a_checkpoint_is_not_found(service, tmp_path):
    with pytest.raises(CheckpointNotFoundError):
        service.create_training_client_from_state(ckpt.checkpoint_id(tmp_path / "nothing"))


def test_weights_only_checkpoint_is_still_reported_as_weights_only(service):
    client = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=3)
    try:
        weights = client.save_weights_for_sampler().result().model_package_arn
        with pytest.raises(InvalidInputError, match="holds weights only"):
            client.load_state_with_optimizer(weights)
    finally:
        client.stop()


def test_load_with_a_corrupt_optimizer_changes_nothing(service, copy_of):
    path, cid = copy_of
    overwrite_near_end(path / "optimizer.pt", 512)
    client = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=11)
    try:
        train(client, 1)
        weights, opt, step = adapter_state(client), client._engine.optimizer.state_dict(), client.step
        loss = client.forward(DATA).result().metrics["loss:sum"]
        with pytest.raises(CheckpointCorruptError, match="optimizer.pt"):
            client.load_state_with_optimizer(cid).result()
        assert same_state(adapter_state(client), weights)
        assert client.step == step
        after = client._engine.optimizer.state_dict()["state"]
        assert all(torch.equal(after[k]["exp_avg"], opt["state"][k]["exp_avg"]) for k in opt["state"])
        assert client.forward(DATA).result().metrics["loss:sum"] == loss
    finally:
        client.stop()


def rewrite_record(path):
    """Re-record a checkpoint's checksums (to build one whose files verify but do not fit)."""
    meta = json.loads((path / ckpt.META).read_text())
    meta["files"] = {
        p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in path.iterdir()
        if p.name != ckpt.META
    }
    meta["meta_sha256"] = ckpt._meta_digest(meta)
    (path / ckpt.META).write_text(json.dumps(meta))


def test_optimizer_state_that_does_not_fit_is_rolled_back(service, copy_of):
    path, cid = copy_of
    other = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=3, train_mlp=False)
    try:
        train(other, 1)
        torch.save(other._engine.optimizer.state_dict(), path / "optimizer.pt")  # fewer parameters
    finally:
        other.stop()
    rewrite_record(path)
    client = service.create_lora_training_client("tiny", rank=4, alpha=8, seed=11)
    try:
        train(client, 1)
        weights, step = adapter_state(client), client.step
        with pytest.raises(CheckpointCorruptError, match="optimizer.pt does not fit this session"):
            client.load_state_with_optimizer(cid).result()
        assert same_state(adapter_state(client), weights) and client.step == step
        train(client, 1)  # the session still trains
    finally:
        client.stop()


def test_checkpoint_from_before_checksums_still_loads(service, copy_of):
    path, cid = copy_of
    meta = json.loads((path / ckpt.META).read_text())
    del meta["files"], meta["meta_sha256"]
    (path / ckpt.META).write_text(json.dumps(meta))
    client = service.create_training_client_from_state_with_optimizer(cid)
    try:
        assert client.step == 2
    finally:
        client.stop()
    (path / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointCorruptError, match="adapter_model.safetensors cannot be parsed"):
        service.create_training_client_from_state(cid)
