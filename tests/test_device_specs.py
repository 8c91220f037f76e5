"""Device specs derived from torch (``lightning_anyaccel.device.devices``): no code for a device torch reports, and an
unknown device never breaks a known one. In-process and fast; the emulated ``acme`` runs of the same code are
``pytest -m device_generic --device emulated:acme`` and ``tests/test_emulator.py``."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from lightning import Fabric, Trainer
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.pytorch.accelerators import AcceleratorRegistry

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.checkpoints.checkpoint import portable_map_location
from lightning_anyaccel.device import devices, runtime
from lightning_anyaccel.device.devices import DEVICE_TABLE, DeviceSpec, derive_spec, get_spec, register_device
from lightning_anyaccel.device.precision import PrecisionNotSupportedError, check_precision
from lightning_anyaccel.wiring import policy

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def test_derived_cpu_spec_agrees_with_the_table():
    """What torch tells about cpu is what the table knows (the table only adds Lightning's name and quirks)."""
    derived, known = derive_spec("cpu"), DEVICE_TABLE["cpu"]
    assert (derived.backend, derived.autocast_dtypes, derived.private_use1) == (known.backend, known.autocast_dtypes,
                                                                               known.private_use1)
    assert derived.vendor_module is None and derive_spec("nosuch") is None


def test_table_entry_is_narrowed_by_what_torch_accepts(monkeypatch):
    """The table says xpu autocasts bf16/fp16; a torch without XPU autocast narrows it, and bf16 is refused."""
    real = torch.amp.is_autocast_available
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda t: False if t == "xpu" else real(t))
    assert get_spec("xpu").autocast_dtypes == () and get_spec("xpu").backend == "xccl"
    with pytest.raises(PrecisionNotSupportedError, match="Choose one of: '32-true'"):
        check_precision("bf16-mixed", "xpu")


def test_register_device_registers_the_accelerator_name():
    """A runtime registration is reachable as accelerator="<name>" in the Trainer and in Fabric at once."""
    spec = DeviceSpec(type="zz9", name="ZZ9", backend=None, autocast_dtypes=())
    try:
        register_device(spec)
        assert "zz9" in AcceleratorRegistry and "zz9" in ACCELERATOR_REGISTRY
        assert AcceleratorRegistry["zz9"]["accelerator"].device_type == "zz9"
    finally:
        DEVICE_TABLE.pop("zz9", None)
        AcceleratorRegistry.remove("zz9")
        ACCELERATOR_REGISTRY.remove("zz9")


def test_an_unknown_device_never_breaks_the_cpu_report(monkeypatch, caplog, lightning_info_logs):
    """The device report of a CPU Trainer, with a device type installed that no one knows: logged, not raised."""
    monkeypatch.setattr(runtime, "detect_device_type", lambda: "nosuchdev")
    with pytest.warns(UserWarning, match="NOSUCHDEV device \\(nosuchdev\\) is available but this Trainer trains on cpu"):
        Trainer(accelerator=AnyAccelerator("cpu"), devices=1, **QUIET)
    assert "NOSUCHDEV device available: True (nosuchdev), used: False" in caplog.text


@pytest.mark.device_generic
def test_auto_names_the_device_only_the_package_serves(device, monkeypatch, caplog, lightning_info_logs):
    """Lightning's own choice (``LIGHTNING_ANYACCEL_AUTO=lightning``) trains on CPU; the report then names the present
    device and how to use it.

    On the emulated device this is the real device; on CPU a present type is simulated."""
    if get_spec(device.type).lightning_builtin and not device.is_cpu:
        pytest.skip(f"Lightning's own 'auto' picks {device.type!r}: the package serves no device alone here")
    if device.is_cpu:
        monkeypatch.setattr(devices, "present_device_types", lambda: ["nosuchdev"])
    present = "nosuchdev" if device.is_cpu else device.type
    monkeypatch.setenv("LIGHTNING_ANYACCEL_AUTO", "lightning")
    trainer = Trainer(accelerator="auto", devices=1, **QUIET)
    assert trainer.strategy.root_device.type == "cpu"
    assert policy.unused_device_message(present, "cpu") in caplog.text, caplog.text
    assert f"accelerator='any' or '{present}' trains on it" in caplog.text


@pytest.mark.device_generic
def test_the_device_under_test_needs_no_code(device):
    """Every name works for the device under test: "any", its type, and AnyAccelerator(type), for Trainer and Fabric."""
    if device.is_cpu:
        pytest.skip("cpu is Lightning's own name")
    assert get_spec(device.type).type == device.type
    for accelerator in ("any", device.type, AnyAccelerator(device.type)):
        trainer = Trainer(accelerator=accelerator, devices=1, **QUIET)
        assert trainer.strategy.root_device == torch.device(device.type, 0)
    assert Fabric(accelerator=device.type, devices=1).device == torch.device(device.type, 0)
    buffer = io.BytesIO()  # a checkpoint written on the device stays there when loaded portably
    torch.save(torch.ones(2, device=torch.device(device.type, 0)), buffer)
    buffer.seek(0)
    assert torch.load(buffer, map_location=portable_map_location).device == torch.device(device.type, 0)
    if device.type not in DEVICE_TABLE:  # acme: every fact came from torch
        spec = get_spec(device.type)
        assert spec.backend == device.backend and spec.private_use1 and "bf16" in spec.autocast_dtypes
        assert dataclasses.replace(spec, notes="") == dataclasses.replace(derive_spec(device.type), notes="")


def test_the_accelerator_keeps_the_spec_it_was_given(monkeypatch):
    """``AnyAccelerator(spec)`` keeps that spec and asks the device table nothing more; a type resolves once, when the
    accelerator is made; a spec of another type than the class's is refused naming both."""
    spec = get_spec("cpu")
    asked = []
    real = devices.get_spec
    monkeypatch.setattr("lightning_anyaccel.accelerator.get_spec", lambda t: asked.append(t) or real(t))
    given = AnyAccelerator(spec)
    assert given.spec is spec and asked == []
    named = AnyAccelerator("cpu")
    assert named.spec == spec and asked == ["cpu"]
    assert spec.device(3) == torch.device("cpu") and get_spec("xpu").device(3) == torch.device("xpu", 3)
    with pytest.raises(ValueError, match="AnyAccelerator\\[cpu\\] is for 'cpu', not 'xpu'"):
        type(given)(get_spec("xpu"))
