"""Simulated devices: the package's decisions for xpu, hpu, mps and cuda (and a PrivateUse1 vendor's
backend name) on a CPU build; PrivateUse1 devices themselves run on the emulated accelerator.

torch's device APIs are monkeypatched (see ``fakes.py``); each test checks what the package
derives from them: device lists, backend choice, precision device, RNG seeding, messages.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import SingleDeviceStrategy

import lightning_anyaccel  # noqa: F401  (registers names)
from fakes import install_fake_device
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDDPStrategy,
    AnySingleDeviceStrategy,
    DeviceCountError,
    accelerator_class,
    get_spec,
    resolve_backend,
)
from lightning_anyaccel.precision import align_precision_plugin
from lightning_anyaccel.distributed import BackendError

# Built-in (non-PrivateUse1) device types: simulated in this process.
IN_PROCESS = ["xpu", "hpu", "cuda", "mps"]
EXPECTED_BACKEND = {"xpu": "xccl", "hpu": "hccl", "cuda": "nccl", "npu": "hccl", "sdaa": "tccl", "mlu": "cncl",
                    "musa": "mccl"}


def rank_devices(device_type: str, count: int) -> list[torch.device]:
    """Each local rank's device: ``<type>:<rank>``, or ``<type>:0`` where every process sees only its card (Gaudi)."""
    if get_spec(device_type).process_device_env:
        return [torch.device(device_type, 0)] * count
    return [torch.device(device_type, i) for i in range(count)]


def _trainer(**kwargs):
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return Trainer(**{**defaults, **kwargs})


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


def test_hpu_never_gets_the_fake_backend(monkeypatch):
    # Lightning's import registers hpu -> 'fake' in torch's default map; we must not use it.
    assert torch.distributed.Backend.default_device_backend_map.get("hpu") == "fake"
    install_fake_device(monkeypatch, "hpu", backend="hccl")
    assert resolve_backend(torch.device("hpu", 0)) == "hccl"
    with pytest.raises(RuntimeError, match="test stub"):
        resolve_backend(torch.device("hpu", 0), explicit="fake")


@pytest.mark.parametrize("device_type", ["xpu", "hpu", "cuda"])
def test_ddp_trainer_uses_device_backend_and_precision(monkeypatch, device_type):
    install_fake_device(monkeypatch, device_type, backend=EXPECTED_BACKEND[device_type])
    trainer = _trainer(accelerator=AnyAccelerator(device_type), strategy="any_ddp", devices=2, precision="bf16-mixed")
    strategy = trainer.strategy
    assert isinstance(strategy, AnyDDPStrategy)
    assert strategy.parallel_devices == rank_devices(device_type, 2)
    assert strategy._get_process_group_backend() == EXPECTED_BACKEND[device_type]
    assert isinstance(strategy.precision_plugin, MixedPrecision)
    assert strategy.precision_plugin.device == device_type  # Lightning alone would say "cuda"/"cpu"


@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_single_device_strategy_takes_selected_device(monkeypatch, device_type):
    install_fake_device(monkeypatch, device_type, count=2 if device_type != "mps" else 1)
    if get_spec(device_type).process_device_env:  # Gaudi: a card is chosen by HABANA_VISIBLE_MODULES, not an index
        with pytest.raises(DeviceCountError, match="HABANA_VISIBLE_MODULES=1 and pass devices=1"):
            _trainer(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=[1])
        return
    devices = [1] if device_type != "mps" else 1
    trainer = _trainer(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=devices)
    assert isinstance(trainer.strategy, AnySingleDeviceStrategy)
    expected = torch.device(device_type, 1 if device_type != "mps" else 0)
    assert trainer.strategy.root_device == expected


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


@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_device_stats_and_teardown(monkeypatch, device_type):
    fake = install_fake_device(monkeypatch, device_type)
    accelerator = AnyAccelerator(device_type)
    stats = accelerator.get_device_stats(torch.device(device_type, 0))
    assert stats and all(isinstance(v, (int, float)) for v in stats.values())
    accelerator.teardown()
    assert ("empty_cache",) in fake.calls


@pytest.mark.parametrize("device_type", IN_PROCESS)
def test_mixed_precision_is_rebuilt_for_the_device(monkeypatch, device_type):
    install_fake_device(monkeypatch, device_type)
    plugin = align_precision_plugin(MixedPrecision("bf16-mixed", "cuda" if device_type != "cuda" else "cpu"),
                                    device_type)
    assert plugin.device == device_type
    assert plugin.precision == "bf16-mixed"


def test_more_devices_than_exist(monkeypatch):
    install_fake_device(monkeypatch, "xpu", count=2)
    with pytest.raises(DeviceCountError, match=r"asks for Intel GPU \(XPU\) device\(s\) \[2, 3\], but this machine has 2"):
        _trainer(accelerator=AnyAccelerator("xpu"), strategy="any_ddp", devices=4)
    with pytest.raises(DeviceCountError, match="lists a device twice"):
        accelerator_class("xpu").parse_devices([0, 0])
    with pytest.raises(DeviceCountError, match="selects no"):
        accelerator_class("xpu").parse_devices(0)


def test_device_without_bf16_fails_at_setup(monkeypatch):
    install_fake_device(monkeypatch, "cuda", bf16=False, backend="nccl")
    trainer = _trainer(accelerator=AnyAccelerator("cuda"), strategy="any_single", devices=1, precision="bf16-mixed")
    with pytest.raises(ValueError, match="does not support bfloat16.*16-mixed"):
        trainer.strategy.accelerator.setup(trainer)


def test_fork_refused_after_device_init(monkeypatch):
    install_fake_device(monkeypatch, "xpu", initialized=True, backend="xccl")
    with pytest.raises(RuntimeError, match=r"already initialised.*any_ddp' \(popen.*any_ddp_spawn"):
        _trainer(accelerator=AnyAccelerator("xpu"), strategy="any_ddp_notebook", devices=2)
    # popen and spawn are fine after initialisation
    trainer = _trainer(accelerator=AnyAccelerator("xpu"), strategy="any_ddp_spawn", devices=2)
    assert trainer.strategy._start_method == "spawn"


def test_fork_launcher_checks_right_before_forking(monkeypatch):
    fake = install_fake_device(monkeypatch, "xpu", backend="xccl")
    trainer = _trainer(accelerator=AnyAccelerator("xpu"), strategy="any_ddp_fork", devices=2)
    fake.initialized = True  # e.g. a notebook cell touched the device after the Trainer was made
    with pytest.raises(RuntimeError, match="already initialised"):
        trainer.strategy.launcher.launch(lambda: None)


def test_unregistered_backend_names_the_fix(monkeypatch):
    install_fake_device(monkeypatch, "xpu")  # this CPU build has no xccl
    with pytest.raises(RuntimeError, match=r"'xccl' for Intel GPU \(XPU\).*not registered.*process_group_backend="):
        _trainer(accelerator=AnyAccelerator("xpu"), strategy="any_ddp", devices=2)


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
# when it is missing, checked for one PrivateUse1 name.
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
