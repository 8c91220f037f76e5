"""Checkpoint faults in one process: full disks, write errors, kills between renames, broken files.

The multi-process kills (mid-save of a sharded checkpoint, preemption) are in ``test_faults.py``.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from lightning.fabric.strategies import SingleDeviceStrategy

from lightning_anyaccel.checkpoints.atomic_commit import OLD_SUFFIX, commit, recover
from lightning_anyaccel.checkpoints.checkpoint import (
    AtomicCheckpointIO,
    CheckpointLoadError,
    CheckpointSaveError,
    describe_checkpoint,
)
from lightning_anyaccel.strategies.atomic_save import save_atomically


def _state(size: int = 16) -> dict:
    return {"weights": torch.arange(size, dtype=torch.float32), "global_step": size}


def test_write_error_fails_the_save_and_keeps_the_previous_file(tmp_path: Path, monkeypatch) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint(_state(4), path)

    def full_disk(checkpoint, file) -> None:
        file.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(io, "_write", full_disk)
    with pytest.raises(CheckpointSaveError, match=r"last\.ckpt: No space left on device.*previous checkpoint"):
        io.save_checkpoint(_state(8), path)
    assert io.load_checkpoint(path)["global_step"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_really_full_disk_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """A 256 KiB tmpfs: the first checkpoint fits, a 1 MB one does not."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", f"anyaccel-{uuid.uuid4().hex[:8]}", str(mount)],
                   check=True, timeout=30)
    try:
        io = AtomicCheckpointIO()
        io.save_checkpoint(_state(1000), mount / "last.ckpt")
        with pytest.raises(CheckpointSaveError, match="No space left on device"):
            io.save_checkpoint(_state(250_000), mount / "last.ckpt")
        assert io.load_checkpoint(mount / "last.ckpt")["global_step"] == 1000
        assert [p.name for p in mount.iterdir()] == ["last.ckpt"]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=30)


def _write_directory(files: dict[str, bytes]):
    def write(staged: Path) -> None:
        staged.mkdir()
        for name, data in files.items():
            (staged / name).write_bytes(data)
    return write


def test_sharded_save_replaces_the_directory_atomically(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    target = tmp_path / "last.ckpt"
    save_atomically(strategy, target, _write_directory({"__0_0.distcp": b"old", ".metadata": b"old"}))
    save_atomically(strategy, target, _write_directory({"__0_0.distcp": b"new", ".metadata": b"new"}))
    assert (target / "__0_0.distcp").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # neither the staged nor the old copy left


def test_sharded_save_error_keeps_the_previous_directory(tmp_path: Path) -> None:
    strategy = SingleDeviceStrategy(device=torch.device("cpu"))
    target = tmp_path / "last.ckpt"
    save_atomically(strategy, target, _write_directory({"__0_0.distcp": b"old"}))

    def fails_halfway(staged: Path) -> None:
        _write_directory({"__0_0.distcp": b"part"})(staged)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(CheckpointSaveError, match=r"rank 0: OSError: \[Errno 28\] No space left on device"):
        save_atomically(strategy, target, fails_halfway)
    assert (target / "__0_0.distcp").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_a_kill_between_the_two_renames_is_recovered(tmp_path: Path, monkeypatch) -> None:
    """Where names cannot be exchanged atomically, the old checkpoint waits under a known name."""
    import lightning_anyaccel.checkpoints.atomic_commit as module

    monkeypatch.setattr(module, "_exchange", lambda a, b: False)
    target, staged = tmp_path / "last.ckpt", tmp_path / "staged"
    target.mkdir()
    (target / "a").write_text("old")
    staged.mkdir()
    (staged / "a").write_text("new")
    real_rename = os.rename
    calls = []

    def killed_after_first_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")  # what a kill between the two renames leaves behind
        real_rename(src, dst)

    monkeypatch.setattr(module.os, "rename", killed_after_first_rename)
    with pytest.raises(KeyboardInterrupt):
        commit(staged, target)
    monkeypatch.setattr(module.os, "rename", real_rename)
    assert not target.exists() and (tmp_path / f".last.ckpt{OLD_SUFFIX}").exists()
    assert (recover(target) / "a").read_text() == "old"


def test_exchange_swaps_a_file_for_a_directory(tmp_path: Path) -> None:
    target, staged = tmp_path / "last.ckpt", tmp_path / ".staged"
    target.write_text("single file")
    staged.mkdir()
    (staged / ".metadata").write_text("sharded")
    commit(staged, target)
    assert (target / ".metadata").read_text() == "sharded" and not staged.exists()


def test_truncated_checkpoint_fails_with_the_file_and_the_problem(tmp_path: Path) -> None:
    io = AtomicCheckpointIO()
    path = tmp_path / "epoch=0-step=4.ckpt"
    io.save_checkpoint(_state(1000), path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointLoadError, match=r"epoch=0-step=4\.ckpt.*truncated or corrupted.*single-file"):
        io.load_checkpoint(path)


def test_sharded_directory_given_to_a_single_file_strategy_is_named(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "last.ckpt"
    dcp.save({"model": {"w": torch.ones(4)}}, checkpoint_id=path, no_dist=True)
    assert "distributed-checkpoint directory" in describe_checkpoint(path)
    with pytest.raises(CheckpointLoadError, match=r"last\.ckpt.*torch distributed-checkpoint directory \(FSDP"):
        AtomicCheckpointIO().load_checkpoint(path)
