"""Simulated devices: the package's decisions for xpu, hpu, mps and cuda (and a PrivateUse1 vendor's
backend name) on a CPU build, through both front ends; PrivateUse1 devices themselves run on the
emulated accelerator.

torch's device APIs are monkeypatched (see ``fakes.py``); each test checks what the package
derives from them: device lists, backend choice, precision device, RNG seeding, messages. A
behaviour both front ends have is one test parameterised by front end (``front_ends.py``); what
only Fabric has (its precision cache, ``fabric.load``, ``seed_everything``) is tested for Fabric.
Nothing here starts a process of its own except the PrivateUse1 tests (a device type can be
renamed once per process) or touches a real accelerator.
"""

from __future__ import annotations

import json
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning import Fabric
from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
from lightning.fabric.strategies import SingleDeviceStrategy
from lightning.pytorch.plugins.precision import MixedPrecision

import lightning_anyaccel  # noqa: F401  (registers names)
from fakes import FakeDeviceModule, install_fake_device
from front_ends import EVERY_FRONT_END, FRONT_ENDS, FrontEndCase
from lightning_anyaccel import (
    AnyAccelerator,
    DeviceCountError,
    accelerator_class,
    get_spec,
    resolve_backend,
)
from lightning_anyaccel.device.distributed import BackendError, ForkAfterInitError
from lightning_anyaccel.device.precision import PrecisionNotSupportedError, align_precision_plugin
from lightning_anyaccel.fabric import AnyDDPStrategy, AnySingleDeviceStrategy, seed_everything
from lightning_anyaccel.strategies.errors import NotebookLaunchError

SCRIPTS = Path(__file__).parent / "scripts"
# Built-in (non-PrivateUse1) device types: simulated in this process.
IN_PROCESS = ["xpu", "hpu", "cuda", "mps"]
EXPECTED_BACKEND = {"xpu": "xccl", "hpu": "hccl", "cuda": "nccl", "npu": "hccl", "sdaa": "tccl", "mlu": "cncl",
                    "musa": "mccl"}


def simulated(feature: str, *device_types: str) -> list[Any]:
    """``device_types`` as parameters, each marked as showing ``feature`` for it (the support matrix's simulated
    level: ``--simulated-records``, tests/validation_record.py)."""
    return [pytest.param(t, marks=pytest.mark.simulates(t, feature)) for t in device_types]


def rank_devices(device_type: str, count: int) -> list[torch.device]:
    """Each local rank's device: ``<type>:<rank>``, or ``<type>:0`` where every process sees only its card (Gaudi)."""
    if get_spec(device_type).process_device_env:
        return [torch.device(device_type, 0)] * count
    return [torch.device(device_type, i) for i in range(count)]


@pytest.fixture
def fake_device(monkeypatch):
    """``fake_device("xpu", backend="xccl")``: make PyTorch report that device (``tests/fakes.py``)."""

    def make(device_type: str, count: int = 2, *, backend: str | None = None, **state: Any) -> FakeDeviceModule:
        return install_fake_device(monkeypatch, device_type, count, backend=backend, **state)

    return make


# ----- devices: what the accelerator lists (one class for both front ends) ----------------------

@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_detects_and_lists_devices(monkeypatch, device_type):
    install_fake_device(monkeypatch, device_type, count=2 if device_type != "mps" else 1)
    accelerator = AnyAccelerator()
    assert accelerator.device_type == device_type
    cls = type(accelerator)
    if device_type == "mps":
        assert cls.get_parallel_devices(cls.parse_devices(1)) == [torch.device("mps", 0)]
        return
    assert cls.auto_device_count() == 2
    assert cls.parse_devices("auto") == [0, 1]
    assert cls.parse_devices(-1) == [0, 1]
    assert cls.parse_devices("0,1") == [0, 1]
    assert cls.parse_devices([1]) == [1]
    assert cls.parse_devices("1") == [0]
    assert cls.get_parallel_devices([0, 1]) == cls.get_parallel_devices(2) == rank_devices(device_type, 2)


def test_device_lists_that_select_nothing_or_twice(monkeypatch):
    install_fake_device(monkeypatch, "xpu", count=2)
    with pytest.raises(DeviceCountError, match="lists a device twice"):
        accelerator_class("xpu").parse_devices([0, 0])
    with pytest.raises(DeviceCountError, match="selects no"):
        accelerator_class("xpu").parse_devices(0)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_more_devices_than_exist(fake_device, front_end: FrontEndCase):
    fake_device("xpu", backend="xccl")
    with pytest.raises(DeviceCountError, match=r"devices=4 asks for Intel GPU \(XPU\) device\(s\) \[2, 3\], but this"
                                               r" machine has 2 \(xpu:0..1\).*ZE_FLAT_DEVICE_HIERARCHY=FLAT"):
        front_end.build(accelerator=front_end.package.AnyAccelerator("xpu"), strategy="any_ddp", devices=4)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("device_type", simulated("single_device", *IN_PROCESS))
def test_single_device_strategy_takes_selected_device(fake_device, front_end: FrontEndCase, device_type):
    fake_device(device_type, count=2 if device_type != "mps" else 1)
    if get_spec(device_type).process_device_env:  # Gaudi: a card is chosen by HABANA_VISIBLE_MODULES, not an index
        with pytest.raises(DeviceCountError, match="HABANA_VISIBLE_MODULES=1 and pass devices=1"):
            front_end.build(accelerator=front_end.package.AnyAccelerator(device_type), strategy="any_single", devices=[1])
        return
    devices = [1] if device_type != "mps" else 1
    built = front_end.build(accelerator=front_end.package.AnyAccelerator(device_type), strategy="any_single", devices=devices)
    assert type(built.strategy) is front_end.package.AnySingleDeviceStrategy
    expected = torch.device(device_type, 1 if device_type != "mps" else 0)
    assert built.strategy.root_device == expected


@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_seeds_device_rng_and_sets_index(monkeypatch, device_type):
    fake = install_fake_device(monkeypatch, device_type, count=2)
    monkeypatch.setenv("PL_GLOBAL_SEED", "1234")
    accelerator = AnyAccelerator(device_type)
    accelerator.setup_device(torch.device(device_type, 1))
    seed_call = get_spec(device_type).seed_functions[0]
    assert (seed_call, 1234) in fake.calls
    if device_type != "mps":
        assert ("set_device_index", 1) in fake.calls


@pytest.mark.parametrize("device_type", simulated("device_stats", *IN_PROCESS))
def test_device_stats_and_teardown(monkeypatch, device_type):
    fake = install_fake_device(monkeypatch, device_type)
    accelerator = AnyAccelerator(device_type)
    stats = accelerator.get_device_stats(torch.device(device_type, 0))
    assert stats and all(isinstance(v, (int, float)) for v in stats.values())
    accelerator.teardown()
    assert ("empty_cache",) in fake.calls


# ----- backend choice ---------------------------------------------------------------------------

@pytest.mark.parametrize("device_type", ["xpu", "hpu", "cuda"])
def test_backend_follows_device_table(monkeypatch, device_type):
    backend = EXPECTED_BACKEND[device_type]
    install_fake_device(monkeypatch, device_type, backend=backend)
    assert resolve_backend(torch.device(device_type, 0)) == backend
    # torch registered gloo for cpu and cuda only: a user's gloo for another device is refused, naming the fix
    if device_type == "cuda":
        assert resolve_backend(torch.device(device_type, 0), explicit="gloo") == "gloo"
    else:
        with pytest.raises(BackendError, match=f"'gloo' can not carry .*Pass process_group_backend='{backend}'"):
            resolve_backend(torch.device(device_type, 0), explicit="gloo")


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("device_type", simulated("ddp", "xpu", "hpu", "cuda"))
def test_ddp_uses_device_backend_and_precision(fake_device, front_end: FrontEndCase, device_type):
    backend = EXPECTED_BACKEND[device_type]
    fake_device(device_type, backend=backend)
    built = front_end.build(accelerator=front_end.package.AnyAccelerator(device_type), strategy="any_ddp", devices=2,
                            precision="bf16-mixed")
    strategy = built.strategy
    assert isinstance(strategy, front_end.package.AnyDDPStrategy)
    # Gaudi: every process sees its own card as hpu:0
    assert strategy.parallel_devices == rank_devices(device_type, 2)
    assert strategy._get_process_group_backend() == backend
    assert strategy.process_group_backend == backend  # right after construction, as vendor plugins report it
    plugin = front_end.precision(built)
    assert isinstance(plugin, front_end.mixed_precision)
    assert plugin.device == device_type  # Lightning alone would say "cuda"/"cpu"


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_hpu_never_gets_the_fake_backend(fake_device, front_end: FrontEndCase):
    # Lightning's import registers hpu -> 'fake' in torch's default map; we must not use it.
    assert dist.Backend.default_device_backend_map.get("hpu") == "fake"
    fake_device("hpu", backend="hccl")
    assert resolve_backend(torch.device("hpu", 0)) == "hccl"
    with pytest.raises(RuntimeError, match="test stub"):
        resolve_backend(torch.device("hpu", 0), explicit="fake")
    strategy = front_end.build(accelerator="hpu", strategy="any_ddp", devices=2).strategy
    assert strategy._get_process_group_backend() == "hccl"
    with pytest.raises(BackendError, match="'fake' is a test stub that does no real communication. Use 'hccl'"):
        front_end.build(accelerator="hpu", strategy=front_end.package.AnyDDPStrategy(process_group_backend="fake"),
                        devices=2)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_unregistered_backend_names_the_fix(fake_device, front_end: FrontEndCase):
    fake_device("xpu")  # this CPU build has no xccl
    with pytest.raises(BackendError, match=r"The collective backend 'xccl' for Intel GPU \(XPU\) \('xpu'\) is not"
                                           r" registered .* pass a registered one with") as raised:
        front_end.build(accelerator=front_end.package.AnyAccelerator("xpu"), strategy="any_ddp", devices=2)
    raised.match(r"'xccl' for Intel GPU \(XPU\).*not registered.*process_group_backend=")


def test_mps_has_no_backend(fake_device) -> None:
    fake_device("mps", count=1)
    with pytest.raises(BackendError, match=r"Apple GPU \(MPS\) has no collective backend"):
        Fabric(accelerator=AnyAccelerator("mps"), strategy="any_ddp", devices=1)


# ----- precision on the accelerator's device type ---------------------------------------------------

@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_mixed_precision_is_rebuilt_for_the_device(monkeypatch, device_type):
    install_fake_device(monkeypatch, device_type)
    plugin = align_precision_plugin(MixedPrecision("bf16-mixed", "cuda" if device_type != "cuda" else "cpu"),
                                    device_type)
    assert plugin.device == device_type
    assert plugin.precision == "bf16-mixed"


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_precision_plugin_for_cuda_is_rebuilt(fake_device, front_end: FrontEndCase) -> None:
    fake_device("xpu", backend="xccl")
    built = front_end.build(accelerator="xpu", strategy="any_ddp", devices=2,
                            plugins=[front_end.mixed_precision("bf16-mixed", device="cuda")])
    assert front_end.precision(built).device == "xpu"


@pytest.mark.parametrize("device_type", simulated("mixed_precision", "xpu", "hpu", "cuda", "mps"))
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_mixed_precision_targets_the_device(fake_device, device_type, precision) -> None:
    fake_device(device_type, count=1)
    fabric = Fabric(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1, precision=precision)
    plugin = fabric._precision  # what Fabric's autocast/backward use
    assert plugin is fabric.strategy.precision and isinstance(plugin, FabricMixedPrecision)
    assert plugin.device == device_type and plugin.precision == precision
    if precision == "16-mixed":
        assert plugin.scaler._device == device_type


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("device_type", ["cuda", "xpu"])
def test_device_without_bf16_fails_before_training(fake_device, front_end: FrontEndCase, device_type) -> None:
    fake = fake_device(device_type, count=1, bf16=False, backend=EXPECTED_BACKEND[device_type])
    built = front_end.build(accelerator=front_end.package.AnyAccelerator(device_type), strategy="any_single", devices=[0],
                            precision="bf16-mixed")
    with pytest.raises(PrecisionNotSupportedError,
                       match=f"at {device_type}:0 does not support bfloat16. Use precision='16-mixed'") as raised:
        front_end.start(built)
    assert isinstance(raised.value, ValueError)
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
    assert isinstance(fabric._precision, FabricMixedPrecision) and fabric._precision.device == "cpu"
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), devices=1, precision="bf16-mixed")
    assert isinstance(fabric.strategy, AnySingleDeviceStrategy) and fabric._precision.device == "cpu"


def test_lightning_single_strategy_on_cpu_allowed() -> None:
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), devices=1)
    fabric.launch()
    assert fabric.device == torch.device("cpu")


# ----- fork safety and notebooks -------------------------------------------------------------------

@pytest.mark.simulates("xpu", "fork_safety")
@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_fork_refused_after_device_init(fake_device, front_end: FrontEndCase):
    fake_device("xpu", initialized=True, backend="xccl")
    with pytest.raises(ForkAfterInitError, match=r"Intel GPU \(XPU\) was already initialised in this process.*"
                                                  r"strategy='any_ddp' \(popen") as raised:
        front_end.build(accelerator=front_end.package.AnyAccelerator("xpu"), strategy="any_ddp_notebook", devices=2)
    raised.match(r"already initialised.*any_ddp' \(popen.*any_ddp_spawn")
    # popen and spawn are fine after initialisation
    built = front_end.build(accelerator=front_end.package.AnyAccelerator("xpu"), strategy="any_ddp_spawn", devices=2)
    assert built.strategy._start_method == "spawn"


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_fork_launcher_checks_right_before_forking(fake_device, front_end: FrontEndCase):
    fake = fake_device("xpu", backend="xccl")
    built = front_end.build(accelerator=front_end.package.AnyAccelerator("xpu"), strategy="any_ddp_fork", devices=2)
    fake.initialized = True  # e.g. a notebook cell touched the device after the Trainer/Fabric was made
    with pytest.raises(ForkAfterInitError, match="already initialised") as raised:
        front_end.launch(built, lambda: None)
    raised.match("forked workers cannot use it")


@pytest.mark.parametrize("strategy", ["any_ddp", "any_ddp_spawn"])
def test_notebook_refuses_popen_and_spawn(monkeypatch, strategy) -> None:
    from lightning.fabric.utilities import imports

    monkeypatch.setattr(imports, "_IS_INTERACTIVE", True)
    with pytest.raises(NotebookLaunchError, match=r"can not run from a notebook.*'any_ddp_notebook' \(fork\)"):
        Fabric(accelerator="any", strategy=strategy, devices=2)


# ----- names (the errors for bad names, through both front ends, are in test_errors.py) ---------------

@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_registered_names_resolve(fake_device, front_end: FrontEndCase) -> None:
    fake_device("xpu", backend="xccl")
    for name, method in [("any_ddp", "popen"), ("any_ddp_spawn", "spawn"), ("any_ddp_fork", "fork"),
                         ("any_ddp_notebook", "fork")]:
        strategy = front_end.build(accelerator="xpu", strategy=name, devices=2).strategy
        assert type(strategy) is front_end.package.AnyDDPStrategy and strategy._start_method == method
    single = front_end.build(accelerator="xpu", strategy="any_single", devices=[1]).strategy
    assert type(single) is front_end.package.AnySingleDeviceStrategy
    assert single.root_device == torch.device("xpu", 1)


def test_front_ends_refuse_each_others_strategies() -> None:
    from lightning import Trainer

    from lightning_anyaccel import AnyDDPStrategy as TrainerDDP

    with pytest.raises(ValueError, match="invalid strategy name: `strategy=<lightning_anyaccel.strategies.ddp"):
        Fabric(accelerator="any", strategy=TrainerDDP(), devices=2)
    with pytest.raises(ValueError, match="invalid strategy name: `strategy=<lightning_anyaccel.fabric.strategies"):
        Trainer(accelerator="any", strategy=AnyDDPStrategy(), devices=2)


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

PRIVATE_USE1_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    sys.path.insert(0, {tests!r})
    torch.utils.rename_privateuse1_backend({device!r})
    import pytest
    from fakes import install_fake_device
    from lightning import Trainer
    import lightning_anyaccel
    from lightning_anyaccel import AnyAccelerator

    mp = pytest.MonkeyPatch()
    fake = install_fake_device(mp, {device!r}, count=2)
    result = {{"detected": AnyAccelerator().device_type}}
    try:
        lightning_anyaccel.resolve_backend(torch.device({device!r}, 0))
    except RuntimeError as err:
        result["unregistered"] = str(err)
    # the vendor registers its backend for the device, as torch_npu / torch_sdaa do
    torch.distributed.Backend.register_backend({backend!r}, lambda *a, **k: None, devices=[{device!r}])
    trainer = Trainer(accelerator={device!r}, strategy="any_ddp", devices=2, precision="bf16-mixed", logger=False)
    result["devices"] = [str(d) for d in trainer.strategy.parallel_devices]
    result["backend"] = trainer.strategy._get_process_group_backend()
    result["precision_device"] = trainer.strategy.precision_plugin.device
    import os; os.environ["PL_GLOBAL_SEED"] = "7"
    trainer.accelerator.setup_device(torch.device({device!r}, 1))
    result["calls"] = fake.calls
    print("RESULT" + json.dumps(result))
    """
)


# The PrivateUse1 names really run on the emulated accelerator (tests/test_emulator.py, and the
# device-generic suite with --device emulated:npu). What stays simulated here is what the emulator
# does not reach: a vendor's own backend name (the emulator registers "emuccl") and the message
# when it is missing, checked for one PrivateUse1 name per front end.
@pytest.mark.parametrize("device_type", ["sdaa"])
def test_private_use1_devices(python_runner, device_type):
    backend = EXPECTED_BACKEND[device_type]
    script = PRIVATE_USE1_SCRIPT.format(tests=str(Path(__file__).parent), device=device_type, backend=backend)
    proc = python_runner(["-c", script], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert result["detected"] == device_type
    assert f"{backend!r}" in result["unregistered"] and "not registered" in result["unregistered"]
    assert result["devices"] == [f"{device_type}:0", f"{device_type}:1"]
    assert result["backend"] == backend
    assert result["precision_device"] == device_type
    assert ["manual_seed_all", 7] in result["calls"]
    assert ["set_device_index", 1] in result["calls"]


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
