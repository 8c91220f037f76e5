"""``Trainer()`` and ``Fabric()`` find the device torch reports once the package is imported (``lightning_anyaccel.wiring.auto``).

In-process, on both Lightning packages (``EVERY_FRONT_END``). The tests marked ``device_generic``
run on the device under test: on CPU they show that a machine without an accelerator keeps
Lightning's own classes, on the emulated ``acme``, ``xpu`` and ``hpu`` (``make test``) that the
device is found and trained on, a type in no table included. Simulated devices (``tests/fakes.py``)
stand in for machines with more devices than the emulator's two. Programs that are not edited
at all (``LIGHTNING_ANYACCEL_ACTIVATE=1``) run in ``tests/test_programs.py``.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap

import pytest
import torch
from torch import nn

import lightning_anyaccel  # noqa: F401  (registers names and the automatic choice)
from conftest import ROOT
from fakes import install_fake_device
from front_ends import EVERY_FRONT_END, EVERY_TRAINER, FrontEndCase
from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning import LIGHTNING
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.wiring import activation, auto
from lightning_anyaccel.wiring.auto import AutoModeError
from lightning_anyaccel.wiring.policy import StrategyNotSupportedError


def _found(caplog: pytest.LogCaptureFixture, count: int, device_type: str) -> bool:
    return f"lightning-anyaccel: found {count} {device_type} device" in caplog.text


@pytest.mark.device_generic
@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_no_accelerator_argument_takes_the_device_torch_reports(front_end: FrontEndCase, device, lightning_info_logs):
    """``Trainer()``/``Fabric()``: every device of the type torch reports, the package's DDP for several, said once;
    on a machine without an accelerator, Lightning's own ``CPUAccelerator`` and ``SingleDeviceStrategy`` (and on a
    device Lightning chooses itself, CUDA or MPS, Lightning's own accelerator)."""
    built = front_end.build()
    if device.is_cpu:
        assert type(built.accelerator) is front_end.lightning.accelerators.CPUAccelerator
        assert type(built.strategy) is front_end.lightning.strategies.SingleDeviceStrategy
        assert "lightning-anyaccel" not in lightning_info_logs.text
        return
    if get_spec(device.type).lightning_builtin:
        assert type(built.accelerator).__module__.startswith(front_end.lightning.__name__ + ".")
        assert built.strategy.root_device.type == device.type
        return
    assert isinstance(built.accelerator, front_end.package.AnyAccelerator)
    assert built.accelerator.device_type == device.type
    expected = front_end.package.AnyDDPStrategy if device.count > 1 else front_end.package.AnySingleDeviceStrategy
    assert type(built.strategy) is expected and len(built.strategy.parallel_devices or [0]) == device.count
    assert _found(lightning_info_logs, device.count, device.type), lightning_info_logs.text
    assert lightning_info_logs.text.count("lightning-anyaccel: found") == 1
    # accelerator="auto" is the same choice; with one device it trains there
    single = front_end.build(accelerator="auto", devices=1)
    assert isinstance(single.strategy, front_end.package.AnySingleDeviceStrategy)
    assert single.strategy.root_device == torch.device(device.type, 0)
    if front_end.side == "fabric":  # Fabric() sets the model up on the device
        model = single.setup(nn.Linear(4, 2))
        assert next(model.parameters()).device == torch.device(device.type, 0)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize(("device_type", "backend"), [("hpu", "hccl"), ("xpu", "xccl")])
def test_every_device_of_a_machine_with_eight(monkeypatch, front_end: FrontEndCase, device_type, backend,
                                              lightning_info_logs) -> None:
    """``devices="auto"`` is all of them: the package's DDP over 8 devices, as ``accelerator="any"`` gives."""
    install_fake_device(monkeypatch, device_type, count=8, backend=backend)
    strategy = front_end.build().strategy
    assert isinstance(strategy, front_end.package.AnyDDPStrategy) and strategy._start_method == "popen"
    per_rank = [0] * 8 if device_type == "hpu" else range(8)  # Gaudi: each process sees its own card as hpu:0
    assert strategy.parallel_devices == [torch.device(device_type, i) for i in per_rank]
    assert _found(lightning_info_logs, 8, device_type) and "training with AnyDDPStrategy on 8 of them" in \
        lightning_info_logs.text


@pytest.mark.parametrize("lightning_choice", ["cuda", "mps", "tpu"])
def test_lightnings_own_choice_of_a_device_is_kept(monkeypatch, lightning_choice) -> None:
    """Where Lightning chose a device itself, that choice stands, whatever else torch reports."""
    install_fake_device(monkeypatch, "xpu", count=2)
    assert auto.choose_accelerator(LIGHTNING, lightning_choice) == lightning_choice


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("reported", ["cuda", "mps"])
def test_a_device_lightning_serves_keeps_lightnings_choice(monkeypatch, front_end: FrontEndCase, reported) -> None:
    """torch reports CUDA or MPS, but Lightning chose the CPU: the package does not step in (Lightning's classes)."""
    install_fake_device(monkeypatch, reported, count=2)
    built = front_end.build()
    assert type(built.accelerator) is front_end.lightning.accelerators.CPUAccelerator


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_opting_out_keeps_lightnings_choice_and_says_so(monkeypatch, front_end: FrontEndCase, lightning_info_logs) -> None:
    """``LIGHTNING_ANYACCEL_AUTO=lightning``: Lightning's ``CPUAccelerator``, and the log names the device and the way to it."""
    install_fake_device(monkeypatch, "hpu", count=2, backend="hccl")
    monkeypatch.setenv(auto.AUTO_ENV, "lightning")
    built = front_end.build()
    assert type(built.accelerator) is front_end.lightning.accelerators.CPUAccelerator
    assert type(built.strategy) is front_end.lightning.strategies.SingleDeviceStrategy
    assert "LIGHTNING_ANYACCEL_AUTO=lightning: accelerator='auto' keeps Lightning's choice, the CPU, although torch" \
           " reports 'hpu' (accelerator='any' or 'hpu' trains on it)" in lightning_info_logs.text
    assert isinstance(front_end.build(accelerator="any").accelerator, front_end.package.AnyAccelerator)  # names work


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_a_wrong_opt_out_names_the_accepted_values(monkeypatch, front_end: FrontEndCase) -> None:
    monkeypatch.setenv(auto.AUTO_ENV, "off")
    with pytest.raises(AutoModeError, match="LIGHTNING_ANYACCEL_AUTO='off' is not an accepted value. Use one of 'device'"
                                            ".*; 'lightning'"):
        front_end.build()
    front_end.build(accelerator="cpu")  # only the automatic choice reads it


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_a_device_torch_reports_but_can_not_use_keeps_the_cpu_and_says_why(monkeypatch, front_end: FrontEndCase) -> None:
    """No device of the reported type is visible: the CPU, with a warning that says why (never silently)."""
    install_fake_device(monkeypatch, "xpu", count=0)
    with pytest.warns(UserWarning, match="accelerator='auto' keeps the CPU: torch reports 'xpu', but its device module"
                                         " says it is not available"):
        built = front_end.build()
    assert type(built.accelerator) is front_end.lightning.accelerators.CPUAccelerator


def test_a_wrong_activation_value_names_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="LIGHTNING_ANYACCEL_ACTIVATE='yes' is not one of '1', '0'"):
        activation.is_active({"LIGHTNING_ANYACCEL_ACTIVATE": "yes"})


@pytest.mark.parametrize("name", ["_lightning_anyaccel_startup", "_lightning_anyaccel_import_hook"])
def test_the_start_up_hooks_examples(name: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


# ----- a program's own Lightning strategy objects, where the package is put to work for it ---------------------


@pytest.fixture
def activated(monkeypatch):
    """This process as ``LIGHTNING_ANYACCEL_ACTIVATE=1`` makes it (the recording wraps are idempotent and only record)."""
    monkeypatch.setenv(activation.ACTIVATE_ENV, "1")

    def record(front_end: FrontEndCase) -> None:
        package = _lightning.distribution_of_module(front_end.lightning.__name__)
        assert package is not None
        activation.record_strategy_arguments(package, front_end.side)

    return record


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_a_programs_lightning_strategies_train_on_the_device_with_their_arguments(
        activated, monkeypatch, front_end: FrontEndCase, lightning_info_logs) -> None:
    """``FSDPStrategy(...)``/``DDPStrategy(...)`` built by the program: the package's strategy, same arguments, said."""
    activated(front_end)
    install_fake_device(monkeypatch, "hpu", count=2, backend="hccl")
    strategies = front_end.lightning.strategies
    fsdp = front_end.build(strategy=strategies.FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="full"),
                           devices=2).strategy
    assert isinstance(fsdp, front_end.package.AnyFSDPStrategy) and fsdp._state_dict_type == "full"
    ddp = front_end.build(strategy=strategies.DDPStrategy(find_unused_parameters=True)).strategy
    assert isinstance(ddp, front_end.package.AnyDDPStrategy) and ddp._ddp_kwargs == {"find_unused_parameters": True}
    assert ddp.parallel_devices == [torch.device("hpu", 0)] * 2
    assert "the program's FSDPStrategy(...) trains on 'hpu' as the package's AnyFSDPStrategy with the same" \
           " arguments (LIGHTNING_ANYACCEL_ACTIVATE=1)" in lightning_info_logs.text

    class ProgramDDP(strategies.DDPStrategy):  # a subclass may hold state of its own: refused, naming the rule
        pass

    with pytest.raises(StrategyNotSupportedError, match="rebuilds only instances of exactly Lightning's DDPStrategy"):
        front_end.build(strategy=ProgramDDP())


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_a_programs_lightning_strategy_stays_lightnings_where_lightning_trains(activated, front_end: FrontEndCase) -> None:
    """On the CPU (a machine without an accelerator) the program's own strategy object is Lightning's, untouched."""
    activated(front_end)
    strategy = front_end.lightning.strategies.DDPStrategy()
    assert front_end.build(strategy=strategy, devices=2).strategy is strategy


# ----- names and classes through a LightningCLI configuration ----------------------------------------------------

CLASS_PATHS = """
trainer:
  accelerator:
    class_path: {package}.AnyAccelerator
    init_args:
      device_type: xpu
  strategy:
    class_path: {package}.AnyDDPStrategy
    init_args:
      find_unused_parameters: true
  devices: 2
"""


@pytest.mark.parametrize("front_end", EVERY_TRAINER)
def test_names_and_class_paths_in_a_lightning_cli_configuration(monkeypatch, tmp_path, front_end: FrontEndCase) -> None:
    """``--trainer.accelerator xpu --trainer.strategy any_ddp``, the package's classes by class path in YAML (the
    block of docs/programs.md too), and no accelerator at all, as a LightningCLI program parses them (``run=False``:
    the Trainer is built, not fitted)."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (the programs extra)")
    install_fake_device(monkeypatch, "xpu", count=2, backend="xccl")
    monkeypatch.setattr(sys, "argv", ["program"])  # the arguments are args=, not pytest's
    cli = importlib.import_module(f"{front_end.lightning.__name__}.cli").LightningCLI
    model = importlib.import_module(f"{front_end.lightning.__name__}.demos.boring_classes").BoringModel
    config, documented = tmp_path / "trainer.yaml", tmp_path / "documented.yaml"
    config.write_text(CLASS_PATHS.format(package=front_end.package.__name__))
    (block,) = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "programs.md").read_text(), flags=re.S)
    documented.write_text(textwrap.dedent(block).replace("lightning_anyaccel.", f"{front_end.package.__name__}."))
    for args in (["--trainer.accelerator", "xpu", "--trainer.strategy", "any_ddp", "--trainer.devices", "2"],
                 ["--config", str(config)], ["--config", str(documented)], []):
        trainer = cli(model, run=False, args=args, save_config_callback=None).trainer
        assert isinstance(trainer.accelerator, front_end.package.AnyAccelerator), args
        assert trainer.accelerator.device_type == "xpu" and trainer.num_devices == 2, args
        assert isinstance(trainer.strategy, front_end.package.AnyDDPStrategy), args
    assert trainer.strategy._ddp_kwargs == {}  # the last: no configuration at all
