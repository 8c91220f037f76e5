"""Bad input fails fast with a message that names the fix (real CPU build, no simulation)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from lightning import Trainer

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDDPStrategy,
    AnySingleDeviceStrategy,
    BackendError,
    DeviceNotAvailableError,
    PrecisionNotSupportedError,
    get_spec,
)
from lightning_anyaccel.device.devices import DEVICE_TABLE


def _trainer(**kwargs):
    return Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, **kwargs)


def test_unknown_device_name():
    with pytest.raises(ValueError, match=r"Unknown device type 'tpu9'\. Known device types: cpu, cuda, .*register_device"):
        AnyAccelerator("tpu9")


def test_unknown_accelerator_string_lists_names():
    with pytest.raises(ValueError, match="invalid accelerator name.*xpu"):
        _trainer(accelerator="tpu9", devices=1)


@pytest.mark.parametrize("device_type", ["xpu", "hpu", "npu", "cuda"])
def test_device_that_is_not_there(device_type):
    spec = get_spec(device_type)
    with pytest.raises(DeviceNotAvailableError, match=rf"sees no {spec.name.split(' (')[0]}.*Install .*AnyAccelerator\(\)"):
        AnyAccelerator(device_type)


def test_registered_name_of_missing_device():
    with pytest.raises(DeviceNotAvailableError, match=r"AnyAccelerator\('xpu'\).*pip install torch --index-url"):
        _trainer(accelerator="xpu", strategy="any_ddp", devices=2)


def test_more_cpu_processes_than_one_with_single_strategy():
    with pytest.raises(Exception, match=r"any_single' trains on one device, but devices= selected 2.*'any_ddp'"):
        _trainer(accelerator=AnyAccelerator(), strategy="any_single", devices=2)


def test_precision_the_device_cannot_do(monkeypatch):
    monkeypatch.setitem(DEVICE_TABLE, "cpu", dataclasses.replace(DEVICE_TABLE["cpu"], autocast_dtypes=("bf16",)))
    with pytest.raises(PrecisionNotSupportedError, match=r"'16-mixed' needs fp16 autocast.*Choose one of: 'bf16-mixed', '32-true'"):
        _trainer(accelerator=AnyAccelerator(), strategy="any_single", devices=1, precision="16-mixed")


def test_precision_unavailable_in_this_torch(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(PrecisionNotSupportedError, match="bf16 autocast"):
        _trainer(accelerator=AnyAccelerator(), strategy=AnyDDPStrategy(), devices=2, precision="bf16-mixed")


def test_unregistered_backend():
    with pytest.raises(BackendError, match=r"'nosuch' for CPU \('cpu'\) is not registered.*registered: .*gloo.*process_group_backend="):
        _trainer(accelerator=AnyAccelerator(), strategy=AnyDDPStrategy(process_group_backend="nosuch"), devices=2)


def test_fake_backend_refused():
    with pytest.raises(BackendError, match="test stub.*'gloo'"):
        _trainer(accelerator=AnyAccelerator(), strategy=AnyDDPStrategy(process_group_backend="fake"), devices=2)


def test_device_without_collective_backend():
    from lightning_anyaccel import resolve_backend

    with pytest.raises(BackendError, match="one device only.*any_single"):
        resolve_backend(torch.device("mps", 0))


def test_strategy_on_another_device_type_than_accelerator():
    strategy = AnySingleDeviceStrategy("meta")
    strategy.accelerator = AnyAccelerator("cpu")
    with pytest.raises(ValueError, match="runs on meta, but the accelerator is AnyAccelerator\\('cpu'\\)"):
        strategy.setup_environment()


@pytest.mark.parametrize("devices", [0, -3, "x"])
def test_bad_cpu_device_counts(devices):
    with pytest.raises(Exception):
        _trainer(accelerator=AnyAccelerator(), strategy="any_ddp", devices=devices)


def test_old_torch_is_refused_without_reinstalling():
    from lightning_anyaccel._compat import check_torch

    with pytest.raises(ImportError, match=r"needs torch >= 2\.8, found 2\.5\.1\+xpu.*never upgrades torch"):
        check_torch("2.5.1+xpu")
