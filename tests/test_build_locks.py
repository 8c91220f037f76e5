"""A torch extension build lock left by a killed build (DeepSpeed ops) fails fast, naming the file."""

from __future__ import annotations

import os
import threading
import time

import pytest

from lightning_anyaccel.cluster import build_locks


def _lock(root, name: str = "cpu_adam", age: float = 0.0):
    lock = root / "py311_cpu" / name / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    if age:
        os.utime(lock, (time.time() - age, time.time() - age))
    return lock


def test_a_lock_older_than_the_bound_fails_at_once_naming_it(tmp_path):
    lock = _lock(tmp_path, age=3600)
    start = time.monotonic()
    with pytest.raises(build_locks.StaleBuildLockError, match=f"rm {lock}"):
        build_locks.wait_for_build_locks(tmp_path, timeout=60)
    assert time.monotonic() - start < 5


def test_a_fresh_lock_that_stays_fails_after_the_bound(tmp_path):
    lock = _lock(tmp_path)
    start = time.monotonic()
    with pytest.raises(build_locks.StaleBuildLockError, match=str(lock)):
        build_locks.wait_for_build_locks(tmp_path, timeout=1.0, poll=0.1)
    assert 1.0 <= time.monotonic() - start < 10


def test_a_lock_released_by_a_running_build_is_waited_for(tmp_path, monkeypatch):
    lock = _lock(tmp_path)
    threading.Timer(0.5, lock.unlink).start()
    build_locks.wait_for_build_locks(tmp_path, timeout=30, poll=0.1)
    assert not lock.exists()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert build_locks.find_build_locks() == []
