"""Feature detection of torch APIs newer than the floor: each one faked present, then absent.

The package needs torch >= 2.8 (``lightning_anyaccel._compat``). Every ``torch.accelerator`` API
it prefers that is newer, or may be missing from a vendor build, is looked up when called; these
tests prove the newer API is used when it is there and the device module when it is not.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tests.fakes import install_fake_device

from lightning_anyaccel import _compat
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec


@pytest.fixture
def xpu(monkeypatch):
    """A simulated current accelerator ``xpu`` with 2 devices (see tests/fakes.py)."""
    return install_fake_device(monkeypatch, "xpu", count=2)


# --- the floor --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.8.0", "2.8.0+xpu", "2.13.0+cpu", "2.15.0a0+git1234", "3.0.0"])
def test_floor_admits(version):
    _compat.check_torch(version)


@pytest.mark.parametrize("version", ["2.7.1+xpu", "2.6.0", "2.1.0+cpu", "1.13.1"])
def test_floor_rejects_with_the_fix(version):
    with pytest.raises(ImportError, match=r"needs torch >= 2\.8, found .*never upgrades torch"):
        _compat.check_torch(version)


def test_installed_torch_meets_the_floor():
    _compat.check_torch(torch.__version__)


# --- current_accelerator(check_available=True) -------------------------------------------------


def test_current_accelerator_asks_for_a_usable_device(monkeypatch):
    seen = []

    def current_accelerator(check_available=False):
        seen.append(check_available)
        return None if check_available else torch.device("cuda")  # built for CUDA, no GPU here

    monkeypatch.setattr(torch.accelerator, "current_accelerator", current_accelerator)
    assert _compat.current_accelerator() is None
    assert seen == [True]
    assert runtime.detect_device_type() == "cpu"


# --- memory: torch.accelerator.memory_stats / empty_cache --------------------------------------


def test_memory_stats_prefers_torch_accelerator(xpu, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.accelerator, "memory_stats", lambda index=None: calls.append(index) or {"a": 1})
    assert runtime.memory_stats(get_spec("xpu"), 1) == {"a": 1}
    assert calls == [1]
    assert not [c for c in xpu.calls if c[0] == "memory_stats"]


def test_memory_stats_falls_back_to_the_device_module(xpu, monkeypatch):
    monkeypatch.delattr(torch.accelerator, "memory_stats")
    assert _compat.torch_features()["accelerator.memory_stats"] is False
    stats = runtime.memory_stats(get_spec("xpu"), 1)
    assert stats["allocated_bytes.all.current"] == 1024
    assert ("memory_stats", "xpu:1") in xpu.calls


def test_empty_cache_prefers_torch_accelerator(xpu, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: calls.append("accelerator"))
    runtime.empty_cache(get_spec("xpu"))
    assert calls == ["accelerator"] and ("empty_cache",) not in xpu.calls


def test_empty_cache_falls_back_to_the_device_module(xpu, monkeypatch):
    monkeypatch.delattr(torch.accelerator, "empty_cache")
    assert _compat.torch_features()["accelerator.empty_cache"] is False
    runtime.empty_cache(get_spec("xpu"))
    assert ("empty_cache",) in xpu.calls


# --- set_device_index, else the device module --------------------------------------------------


def test_set_device_prefers_the_index_name(xpu, monkeypatch):
    monkeypatch.setattr(torch.accelerator, "set_device_idx", lambda i: xpu.calls.append(("set_device_idx", i)),
                        raising=False)
    runtime.set_device_index(get_spec("xpu"), 1)
    assert xpu.calls == [("set_device_index", 1)]


def test_set_device_falls_back_to_the_device_module(xpu, monkeypatch):
    monkeypatch.delattr(torch.accelerator, "set_device_index")
    monkeypatch.delattr(torch.accelerator, "set_device_idx", raising=False)
    assert _compat.torch_features()["accelerator.set_device_index"] is False
    runtime.set_device_index(get_spec("xpu"), 1)
    assert xpu.calls == [("set_device", 1)]


# --- RNG: torch.accelerator.random -------------------------------------------------------------


def test_seed_prefers_torch_accelerator_random(xpu, monkeypatch):
    seeds = []
    monkeypatch.setattr(torch.accelerator, "random", SimpleNamespace(manual_seed_all=seeds.append), raising=False)
    assert _compat.torch_features()["accelerator.random"] is True
    assert runtime.seed(get_spec("xpu"), 7) is True
    assert seeds == [7] and not xpu.calls


def test_seed_falls_back_to_the_device_module(xpu, monkeypatch):
    monkeypatch.delattr(torch.accelerator, "random", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "torch.accelerator.random", None)  # import fails too
    assert _compat.accelerator_random() is None
    assert runtime.seed(get_spec("xpu"), 7) is True
    assert xpu.calls == [("manual_seed_all", 7)]


def test_seed_of_a_device_that_is_not_the_current_accelerator_uses_its_module(xpu, monkeypatch):
    """``torch.accelerator.random`` speaks for the current accelerator only."""
    seeds = []
    monkeypatch.setattr(torch.accelerator, "random", SimpleNamespace(manual_seed_all=seeds.append), raising=False)
    hpu = install_fake_device(monkeypatch, "hpu", count=1)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: SimpleNamespace(type="xpu"))
    assert runtime.seed(get_spec("hpu"), 3) is True
    assert seeds == [] and hpu.calls[0][1] == 3


def test_the_features_of_this_torch_are_reported():
    features = _compat.torch_features()
    assert set(features) == {
        "accelerator.current_accelerator(check_available)", "accelerator.memory_stats",
        "accelerator.empty_cache", "accelerator.set_device_index", "accelerator.random",
    }
    assert all(isinstance(v, bool) for v in features.values())


# --- a backend whose creator returns its own ProcessGroup (torch >= 2.15's flight recorder) -----


class _WholeGroup(torch.distributed.ProcessGroup):
    """A Python process group as some vendors' creators return it: one gloo backend, no default named."""

    def __init__(self, store, rank, size, timeout) -> None:
        super().__init__(rank, size)
        self.defaults: list = []
        self._gloo = torch.distributed.ProcessGroupGloo(store, rank, size, timeout)
        self._register_backend(torch.device("cpu"), torch.distributed.ProcessGroup.BackendType.CUSTOM, self._gloo)

    def _set_default_backend(self, backend_type) -> None:  # recorded, then torch's own
        self.defaults.append(backend_type)
        super()._set_default_backend(backend_type)

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return "wholegroup"

    def allreduce(self, tensors, opts=None):
        return self._gloo.allreduce(tensors)


def test_a_backend_returning_its_own_process_group_gets_its_default_backend():
    """Without a default backend, torch 2.15 fails creating the group ("Could not find the default backend type")."""
    from datetime import timedelta

    import torch.distributed as dist

    from lightning_anyaccel.device.distributed import adopt_whole_group_backend, prepare_backend

    created = []
    if "WHOLEGROUP" not in dist.Backend._plugins:
        dist.Backend.register_backend("wholegroup", lambda *args: created.append(_WholeGroup(*args)) or created[-1],
                                      devices=["cpu"])
    assert not dist.is_initialized()
    assert prepare_backend(torch.device("cpu"), explicit="wholegroup") == "wholegroup"
    adopt_whole_group_backend("wholegroup")  # wrapped once only
    dist.init_process_group("wholegroup", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0]
        assert created[-1].defaults == [dist.ProcessGroup.BackendType.CUSTOM]
    finally:
        dist.destroy_process_group()
