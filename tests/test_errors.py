"""Bad input fails fast with a message that names the fix, through both front ends.

Each behaviour is one test parameterised by front end (``front_ends.py``: ids ``trainer`` and
``fabric``), checking the same message for both. The real CPU build answers, except where a test
needs a device type with a table entry to change (``fakes.py``).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import lightning_anyaccel  # noqa: F401  (registers names)
from fakes import install_fake_device
from front_ends import FRONT_ENDS, FrontEndCase
from lightning_anyaccel import (
    AnyAccelerator,
    BackendError,
    DeviceNotAvailableError,
    PrecisionNotSupportedError,
    get_spec,
)
from lightning_anyaccel.device.devices import DEVICE_TABLE


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_unknown_device_name(front_end: FrontEndCase):
    with pytest.raises(ValueError, match=r"Unknown device type 'tpu9'\. Known device types: cpu, cuda, hpu.*register_device"):
        front_end.package.AnyAccelerator("tpu9")
    with pytest.raises(ValueError, match=r"invalid accelerator name: `accelerator='tpu9'`.*xpu"):
        front_end.build(accelerator="tpu9", devices=1)


@pytest.mark.parametrize("device_type", ["xpu", "hpu", "npu", "cuda"])
def test_device_that_is_not_there(device_type):
    spec = get_spec(device_type)
    with pytest.raises(DeviceNotAvailableError, match=rf"sees no {spec.name.split(' (')[0]}.*Install .*AnyAccelerator\(\)"):
        AnyAccelerator(device_type)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(("strategy", "devices"), [("any_ddp", 2), ("any_single", 1)])
def test_registered_name_of_missing_device(front_end: FrontEndCase, strategy, devices):
    with pytest.raises(DeviceNotAvailableError, match=r"AnyAccelerator\('xpu'\): PyTorch sees no Intel GPU \(XPU\)"
                                                      r" device here\. Install pip install torch --index-url"):
        front_end.build(accelerator="xpu", strategy=strategy, devices=devices)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_single_strategy_with_two_devices(front_end: FrontEndCase):
    for accelerator in ("any", front_end.package.AnyAccelerator()):
        with pytest.raises(Exception, match=r"strategy='any_single' trains on one device, but devices= selected 2"
                                            r".*'any_ddp'"):
            front_end.build(accelerator=accelerator, strategy="any_single", devices=2)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("device_type", ["cpu", "xpu"])
def test_precision_the_device_cannot_do(monkeypatch, front_end: FrontEndCase, device_type):
    if device_type != "cpu":
        install_fake_device(monkeypatch, device_type, count=1)
    monkeypatch.setitem(DEVICE_TABLE, device_type, dataclasses.replace(DEVICE_TABLE[device_type], autocast_dtypes=("bf16",)))
    name = re.escape(get_spec(device_type).name)
    accelerator = front_end.package.AnyAccelerator() if device_type == "cpu" else device_type
    with pytest.raises(PrecisionNotSupportedError,
                       match=rf"precision='16-mixed' needs fp16 autocast, which {name} \('{device_type}'\) does not"
                             r" support in this PyTorch\. Choose one of: 'bf16-mixed', '32-true'"):
        front_end.build(accelerator=accelerator, strategy="any_single", devices=1, precision="16-mixed")


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_precision_unavailable_in_this_torch(monkeypatch, front_end: FrontEndCase):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(PrecisionNotSupportedError, match="bf16 autocast"):
        front_end.build(accelerator=front_end.package.AnyAccelerator(), strategy=front_end.package.AnyDDPStrategy(),
                        devices=2, precision="bf16-mixed")


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_unregistered_backend(front_end: FrontEndCase):
    with pytest.raises(BackendError, match=r"'nosuch' for CPU \('cpu'\) is not registered.*registered: .*gloo.*process_group_backend="):
        front_end.build(accelerator=front_end.package.AnyAccelerator(),
                        strategy=front_end.package.AnyDDPStrategy(process_group_backend="nosuch"), devices=2)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_fake_backend_refused(front_end: FrontEndCase):
    with pytest.raises(BackendError, match="test stub.*'gloo'"):
        front_end.build(accelerator=front_end.package.AnyAccelerator(),
                        strategy=front_end.package.AnyDDPStrategy(process_group_backend="fake"), devices=2)


def test_device_without_collective_backend():
    from lightning_anyaccel import resolve_backend

    with pytest.raises(BackendError, match="one device only.*any_single"):
        resolve_backend(torch.device("mps", 0))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_strategy_on_another_device_type_than_accelerator(front_end: FrontEndCase):
    strategy = front_end.package.AnySingleDeviceStrategy("meta")
    strategy.accelerator = front_end.package.AnyAccelerator("cpu")
    with pytest.raises(ValueError, match="runs on meta, but the accelerator is AnyAccelerator\\('cpu'\\)"):
        strategy.setup_environment()


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("devices", [0, -3, "x"])
def test_bad_cpu_device_counts(front_end: FrontEndCase, devices):
    with pytest.raises(Exception):
        front_end.build(accelerator=front_end.package.AnyAccelerator(), strategy="any_ddp", devices=devices)


def test_old_torch_is_refused_without_reinstalling():
    from lightning_anyaccel._compat import check_torch

    with pytest.raises(ImportError, match=r"needs torch >= 2\.8, found 2\.5\.1\+xpu.*never upgrades torch"):
        check_torch("2.5.1+xpu")
