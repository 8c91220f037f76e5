"""Fabric on simulated devices (monkeypatched torch device APIs) and bad input, in-process.

The simulation replaces what the package asks PyTorch (``torch.get_device_module``,
``torch.accelerator.*``, ``torch.distributed.is_backend_available``); Fabric's connector and
our strategies run unmodified. Nothing here starts a process or touches a real accelerator.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning import Fabric
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.fabric.strategies import SingleDeviceStrategy

import lightning_anyaccel  # noqa: F401
from fakes import FakeDeviceModule, install_fake_device
from lightning_anyaccel import devices as devices_mod
from lightning_anyaccel.accelerator import DeviceCountError
from lightning_anyaccel.distributed import BackendError, ForkAfterInitError
from lightning_anyaccel.fabric import AnyAccelerator, AnyDDPStrategy, AnySingleDeviceStrategy, seed_everything
from lightning_anyaccel.precision import PrecisionNotSupportedError
from lightning_anyaccel.runtime import DeviceNotAvailableError
from lightning_anyaccel.strategies.common import NotebookLaunchError

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def fake_device(monkeypatch):
    """``fake_device("xpu", backend="xccl")``: make PyTorch report that device (``tests/fakes.py``)."""

    def make(device_type: str, count: int = 2, *, backend: str | None = None, **state: Any) -> FakeDeviceModule:
        return install_fake_device(monkeypatch, device_type, count, backend=backend, **state)

    return make


# ----- backend choice ---------------------------------------------------------------------------

@pytest.mark.parametrize(("device_type", "backend"), [("xpu", "xccl"), ("hpu", "hccl"), ("cuda", "nccl")])
def test_backend_follows_device_table(fake_device, device_type, backend) -> None:
    fake_device(device_type, backend=backend)
    fabric = Fabric(accelerator=AnyAccelerator(device_type), strategy="any_ddp", devices=2)
    per_rank = ["0", "0"] if device_type == "hpu" else ["0", "1"]  # Gaudi: every process sees its own card as hpu:0
    assert [str(d) for d in fabric.strategy.parallel_devices] == [f"{device_type}:{i}" for i in per_rank]
    assert fabric.strategy._get_process_group_backend() == backend
    assert fabric.strategy.process_group_backend == backend  # right after construction, as vendor plugins report it


def test_hpu_never_gets_fake_backend(fake_device) -> None:
    assert dist.Backend.default_device_backend_map.get("hpu") == "fake"  # what torch says once Lightning is in
    fake_device("hpu", backend="hccl")
    assert Fabric(accelerator="hpu", strategy="any_ddp", devices=2).strategy._get_process_group_backend() == "hccl"
    with pytest.raises(BackendError, match="'fake' is a test stub that does no real communication. Use 'hccl'"):
        Fabric(accelerator="hpu", strategy=AnyDDPStrategy(process_group_backend="fake"), devices=2)


def test_unregistered_backend_fails_at_construction(fake_device) -> None:
    fake_device("xpu")  # xccl is not in this CPU build of torch
    with pytest.raises(BackendError, match=r"The collective backend 'xccl' for Intel GPU \(XPU\) \('xpu'\) is not"
                                           r" registered .* pass a registered one with"):
        Fabric(accelerator="xpu", strategy="any_ddp", devices=2)


def test_mps_has_no_backend(fake_device) -> None:
    fake_device("mps", count=1)
    with pytest.raises(BackendError, match=r"Apple GPU \(MPS\) has no collective backend"):
        Fabric(accelerator=AnyAccelerator("mps"), strategy="any_ddp", devices=1)


# ----- precision on the accelerator's device type ---------------------------------------------------

@pytest.mark.parametrize("device_type", ["xpu", "hpu", "cuda", "mps"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_targets_the_device(fake_device, device_type, precision) -> None:
    fake_device(device_type, count=1)
    fabric = Fabric(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1, precision=precision)
    plugin = fabric._precision  # what Fabric's autocast/backward use
    assert plugin is fabric.strategy.precision and isinstance(plugin, MixedPrecision)
    assert plugin.device == device_type and plugin.precision == precision
    if precision == "16-mixed":
        assert plugin.scaler._device == device_type


def test_precision_plugin_for_cuda_is_rebuilt(fake_device) -> None:
    fake_device("xpu", backend="xccl")
    fabric = Fabric(accelerator="xpu", strategy="any_ddp", devices=2,
                    plugins=[MixedPrecision("bf16-mixed", device="cuda")])
    assert fabric._precision.device == "xpu"


def test_unsupported_precision_fails_fast(fake_device, monkeypatch) -> None:
    fake_device("xpu", count=1)
    monkeypatch.setitem(devices_mod.DEVICE_TABLE, "xpu",
                        dataclasses.replace(devices_mod.DEVICE_TABLE["xpu"], autocast_dtypes=("bf16",)))
    with pytest.raises(PrecisionNotSupportedError,
                       match=r"precision='16-mixed' needs fp16 autocast, which Intel GPU \(XPU\) \('xpu'\) does not"
                             r" support in this PyTorch. Choose one of: 'bf16-mixed', '32-true'"):
        Fabric(accelerator="xpu", strategy="any_single", devices=1, precision="16-mixed")


def test_device_without_bf16_fails_at_launch(fake_device) -> None:
    fake = fake_device("xpu", count=1, bf16=False)
    fabric = Fabric(accelerator="xpu", strategy="any_single", devices=[0], precision="bf16-mixed")
    with pytest.raises(PrecisionNotSupportedError, match="at xpu:0 does not support bfloat16. Use precision='16-mixed'"):
        fabric.launch()
    assert ("set_device_index", 0) in fake.calls  # the device was selected before the probe


# ----- the accelerator alone picks the package's strategies; Lightning's instances are refused -------

def test_auto_strategy_single_device_trains_on_the_device(fake_device) -> None:
    fake_device("xpu", count=1)
    fabric = Fabric(accelerator="xpu", devices=1, precision="bf16-mixed")
    assert isinstance(fabric.strategy, AnySingleDeviceStrategy)
    assert fabric.device == torch.device("xpu", 0)
    assert fabric.strategy.precision.device == "xpu" and fabric._precision is fabric.strategy.precision


def test_lightning_strategy_names_map_to_the_package(fake_device) -> None:
    fake_device("xpu", backend="xccl")
    fabric = Fabric(accelerator="xpu", strategy="ddp_spawn", devices=2)
    assert isinstance(fabric.strategy, AnyDDPStrategy) and fabric.strategy._start_method == "spawn"
    assert Fabric(accelerator="xpu", devices=2).strategy._start_method == "popen"  # no strategy: any_ddp


def test_lightning_strategy_instances_refused_on_non_cuda(fake_device) -> None:
    from lightning.fabric.strategies import DDPStrategy

    fake_device("xpu", backend="xccl")
    with pytest.raises(Exception, match="Lightning's DDPStrategy can not train on Intel GPU .*strategy='any_ddp'"):
        Fabric(accelerator="xpu", strategy=DDPStrategy(), devices=2)
    with pytest.raises(Exception, match="Lightning's SingleDeviceStrategy can not train on .*strategy='any_single'"):
        Fabric(accelerator="xpu", strategy=SingleDeviceStrategy(device="cpu"), devices=1)
    assert not dist.is_initialized()


def test_cuda_precision_on_cpu_accelerator_repaired() -> None:
    """Lightning's own strategy on CPU stays, but its precision plugin autocasts on CPU, not CUDA."""
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=SingleDeviceStrategy("cpu"), precision="bf16-mixed")
    assert isinstance(fabric._precision, MixedPrecision) and fabric._precision.device == "cpu"
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), devices=1, precision="bf16-mixed")
    assert isinstance(fabric.strategy, AnySingleDeviceStrategy) and fabric._precision.device == "cpu"


def test_lightning_single_strategy_on_cpu_allowed() -> None:
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), devices=1)
    fabric.launch()
    assert fabric.device == torch.device("cpu")


# ----- fork safety and notebooks -------------------------------------------------------------------

def test_fork_after_init_refused_at_construction(fake_device) -> None:
    fake_device("xpu", backend="xccl", initialized=True)
    with pytest.raises(ForkAfterInitError, match=r"Intel GPU \(XPU\) was already initialised in this process.*"
                                                  r"strategy='any_ddp' \(popen"):
        Fabric(accelerator="xpu", strategy="any_ddp_notebook", devices=2)
    Fabric(accelerator="xpu", strategy="any_ddp_spawn", devices=2)  # spawn is fine


def test_fork_after_init_refused_at_launch(fake_device) -> None:
    fake = fake_device("xpu", backend="xccl")
    fabric = Fabric(accelerator="xpu", strategy="any_ddp_fork", devices=2)
    fake.initialized = True  # e.g. a tensor was put on the device between Fabric() and launch()
    with pytest.raises(ForkAfterInitError, match="forked workers cannot use it"):
        fabric.launch(lambda f: None)


@pytest.mark.parametrize("strategy", ["any_ddp", "any_ddp_spawn"])
def test_notebook_refuses_popen_and_spawn(monkeypatch, strategy) -> None:
    from lightning.fabric.utilities import imports

    monkeypatch.setattr(imports, "_IS_INTERACTIVE", True)
    with pytest.raises(NotebookLaunchError, match=r"can not run from a notebook.*'any_ddp_notebook' \(fork\)"):
        Fabric(accelerator="any", strategy=strategy, devices=2)


# ----- devices and names ---------------------------------------------------------------------------

def test_too_many_devices(fake_device) -> None:
    fake_device("xpu", backend="xccl")
    with pytest.raises(DeviceCountError, match=r"devices=4 asks for Intel GPU \(XPU\) device\(s\) \[2, 3\], but this"
                                               r" machine has 2 \(xpu:0..1\)"):
        Fabric(accelerator="xpu", strategy="any_ddp", devices=4)


def test_single_strategy_with_two_devices() -> None:
    with pytest.raises(Exception, match="strategy='any_single' trains on one device, but devices= selected 2"):
        Fabric(accelerator="any", strategy="any_single", devices=2)


def test_unknown_device_name() -> None:
    with pytest.raises(ValueError, match=r"Unknown device type 'foo'. Known device types: cpu, cuda, hpu"):
        AnyAccelerator("foo")
    with pytest.raises(ValueError, match=r"invalid accelerator name: `accelerator='foo'`.*xpu"):
        Fabric(accelerator="foo")


def test_unavailable_device() -> None:
    with pytest.raises(DeviceNotAvailableError, match=r"AnyAccelerator\('xpu'\): PyTorch sees no Intel GPU \(XPU\)"
                                                      r" device here. Install pip install torch --index-url"):
        Fabric(accelerator="xpu", strategy="any_single", devices=1)


def test_registered_names_resolve(fake_device) -> None:
    fake_device("xpu", backend="xccl")
    for name, method in [("any_ddp", "popen"), ("any_ddp_spawn", "spawn"), ("any_ddp_fork", "fork"),
                         ("any_ddp_notebook", "fork")]:
        strategy = Fabric(accelerator="xpu", strategy=name, devices=2).strategy
        assert type(strategy) is AnyDDPStrategy and strategy._start_method == method
    assert type(Fabric(accelerator="xpu", strategy="any_single", devices=[1]).strategy) is AnySingleDeviceStrategy
    assert Fabric(accelerator="xpu", strategy="any_single", devices=[1]).device == torch.device("xpu", 1)


# ----- seeding --------------------------------------------------------------------------------------

def test_device_seeded_at_launch_and_by_helper(fake_device, monkeypatch) -> None:
    fake = fake_device("hpu", count=1)  # torch.manual_seed does not seed HPU
    monkeypatch.setenv("PL_GLOBAL_SEED", "11")
    Fabric(accelerator="hpu", strategy="any_single", devices=1).launch()
    assert [c for c in fake.calls if c[0] == "manual_seed_all"] == [("manual_seed_all", 11)]
    assert ("set_device_index", 0) in fake.calls
    assert seed_everything(5) == 5
    assert [c for c in fake.calls if c[0] == "manual_seed_all"] == [("manual_seed_all", 11), ("manual_seed_all", 5)]


# ----- checkpoints from a device this machine does not have ---------------------------------------

def _as_if_saved_on(path: Path, device_type: str) -> None:
    """Rewrite a CPU checkpoint's storage locations to ``device_type`` (same length: 'cpu' -> 'xpu')."""
    assert len(device_type) == 3
    with zipfile.ZipFile(path) as src:
        entries = {info: src.read(info.filename) for info in src.infolist()}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as dst:
        for info, data in entries.items():
            if info.filename.endswith("data.pkl"):  # torch.save pickles locations as protocol-2 strings
                assert b"X\x03\x00\x00\x00cpu" in data
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x03\x00\x00\x00" + device_type.encode())
            dst.writestr(info, data)


def test_fabric_load_checkpoint_from_missing_device(tmp_path) -> None:
    """A checkpoint written on XPU loads here (no XPU): Fabric's IO keeps storages on CPU, then copies."""
    fabric = Fabric(accelerator="any", strategy="any_single", devices=1)
    model = torch.nn.Linear(3, 1)
    fabric.save(tmp_path / "ck.pt", {"model": model, "step": 7})
    _as_if_saved_on(tmp_path / "ck.pt", "xpu")
    with pytest.raises(RuntimeError, match="xpu|XPU"):  # plain torch.load would put it on the missing device
        torch.load(tmp_path / "ck.pt", weights_only=True)
    raw = fabric.load(tmp_path / "ck.pt")
    assert raw["model"]["weight"].device == torch.device("cpu")
    target = torch.nn.Linear(3, 1)
    state = {"model": target, "step": 0}
    fabric.load(tmp_path / "ck.pt", state)
    assert state["step"] == 7 and torch.equal(target.weight, model.weight)


# ----- PrivateUse1 devices (renamed once per process: in a subprocess) ----------------------------

@pytest.mark.slow
def test_privateuse1_devices_in_subprocess(python_runner) -> None:
    proc = python_runner([str(SCRIPTS / "fabric_privateuse1.py")], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {
        "device": "npu:1",
        "precision_device": "npu",
        "unregistered": "BackendError: The collective backend 'hccl' for Huawei Ascend (NPU) ('npu') is not registered",
        "vendor_registered_backend": "hccl",
    }


def test_front_ends_refuse_each_others_strategies() -> None:
    from lightning import Trainer

    from lightning_anyaccel import AnyDDPStrategy as TrainerDDP

    with pytest.raises(ValueError, match="invalid strategy name: `strategy=<lightning_anyaccel.strategies.ddp"):
        Fabric(accelerator="any", strategy=TrainerDDP(), devices=2)
    with pytest.raises(ValueError, match="invalid strategy name: `strategy=<lightning_anyaccel.fabric.strategies"):
        Trainer(accelerator="any", strategy=AnyDDPStrategy(), devices=2)
