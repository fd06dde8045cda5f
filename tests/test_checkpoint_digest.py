"""Checkpoints are checked by their SHA-256 before any weight is used (issue 67, item 14): `memr1 eval`
and `memr1 rollout` with a damaged `--checkpoint` stop with one line, a rollout records the digest of
the weights it read, and a tampered safetensors header is one line wherever a header is read."""
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from memr1.engine.checkpoints.files import CheckpointError, verify, weights_digest, write_manifest
from memr1.engine.cli import main
from memr1.engine.generation.weights import checkpoint_manifest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ckpt(tiny_model, tmp_path) -> Path:
    """A memr1 checkpoint folder of the tiny model: its files, a training state and the manifest."""
    d = tmp_path / "step_1"
    shutil.copytree(tiny_model, d)
    for name in ("optimizer.pt", "scheduler.pt", "rng_rank0.pt"):
        (d / name).write_bytes(b"state")
    (d / "state.json").write_text(json.dumps({"step": 1}))
    write_manifest(d, 1)
    return d


def flip(f: Path, at: int = -100) -> None:
    data = bytearray(f.read_bytes())
    data[at] ^= 1
    f.write_bytes(bytes(data))


def set_header(f: Path, length: int | None = None, header: bytes | None = None) -> None:
    """Rewrite a safetensors file's header length and/or header bytes, keeping its data."""
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + n] if header is None else header
    f.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data[8 + n:])


def edit_header(f: Path, change) -> None:
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    change(header)
    set_header(f, header=json.dumps(header).encode())


def first_tensor(h: dict) -> dict:
    return h[next(k for k in h if k != "__metadata__")]


HEADERS = {
    "length 2**63": lambda f: set_header(f, length=2 ** 63),
    "length 2**64-1": lambda f: set_header(f, length=2 ** 64 - 1),
    "length past the file": lambda f: set_header(f, length=f.stat().st_size),
    "not JSON": lambda f: set_header(f, header=b"{not json" + b" " * 100),
    "a list": lambda f: set_header(f, header=b"[1, 2, 3]"),
    "nested deep": lambda f: set_header(f, header=b"[" * 100_000),
    "no shape": lambda f: edit_header(f, lambda h: first_tensor(h).pop("shape")),
    "offsets past the data": lambda f: edit_header(f, lambda h: first_tensor(h).update(data_offsets=[0, 2 ** 62])),
    "shape of another size": lambda f: edit_header(f, lambda h: first_tensor(h).update(shape=[10 ** 9, 10 ** 9])),
    "negative dimension": lambda f: edit_header(f, lambda h: first_tensor(h).update(shape=[-1])),
    "too short": lambda f: f.write_bytes(b"\x01\x02"),
}


@pytest.mark.parametrize("damage", list(HEADERS))
def test_a_tampered_header_is_one_message(tiny_model, tmp_path, damage):
    d = tmp_path / "model"
    shutil.copytree(tiny_model, d)
    HEADERS[damage](d / "model.safetensors")
    with pytest.raises(ValueError, match="model.safetensors"):
        checkpoint_manifest(d)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        weights_digest(d)


@pytest.mark.parametrize("damage", ["length 2**63", "not JSON", "offsets past the data"])
def test_a_tampered_header_fails_verification_even_when_the_manifest_agrees(ckpt, damage):
    HEADERS[damage](ckpt / "model.safetensors")
    write_manifest(ckpt, 1)   # re-listed: sizes and checksums match the tampered file
    assert "model.safetensors is not a whole safetensors file" in verify(ckpt)


def test_the_digest_is_of_the_weights_read(ckpt):
    want = {"model.safetensors": hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()}
    digest = hashlib.sha256(json.dumps(want, sort_keys=True).encode()).hexdigest()
    assert weights_digest(ckpt) == digest
    (ckpt / "manifest.json").unlink()   # the same weights without a manifest: the same digest
    assert weights_digest(ckpt) == digest


@pytest.mark.parametrize("damage", [
    lambda d: flip(d / "model.safetensors"),
    lambda d: flip(d / "config.json", at=5),
    lambda d: shutil.copy(d / "model.safetensors", d / "model-extra.safetensors"),
    lambda d: (d / "model.safetensors").unlink() or os.mkfifo(d / "model.safetensors"),
], ids=["a weight byte", "config.json", "an unlisted weights file", "a FIFO"])
def test_eval_and_rollout_refuse_a_damaged_checkpoint_in_one_line(ckpt, capsys, monkeypatch, damage):
    monkeypatch.chdir(ROOT)
    damage(ckpt)
    with pytest.raises(CheckpointError, match=str(ckpt)):   # before a command would go on to load it
        weights_digest(ckpt)
    for argv in (["eval", "--config", "configs/default.toml", "--checkpoint", str(ckpt)],
                 ["rollout", "--config", "configs/default.toml", "--stage", "manager", "--items", "2",
                  "--out", str(ckpt.parent / "out"), "--checkpoint", str(ckpt)],
                 ["eval", "--config", "configs/default.toml", "--manager", str(ckpt)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and str(ckpt) in err, err
    assert not (ckpt.parent / "out").exists()


def test_a_run_dirs_best_checkpoint_is_checked_by_its_checksum(ckpt, tmp_path):
    from memr1.engine.checkpoints.io import final_checkpoint

    stage = tmp_path / "run" / "manager"
    (stage / "checkpoints").mkdir(parents=True)
    best = shutil.copytree(ckpt, stage / "checkpoints" / "step_1")
    (stage / "best.json").write_text(json.dumps({"step": 1}))
    assert final_checkpoint(stage) == best
    flip(best / "model.safetensors")
    assert final_checkpoint(stage) is None
