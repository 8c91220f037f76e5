"""The spellings a user migrating from lightning-habana or lightning-teco passes: each works or fails naming ours.

- every strategy name the two plugins register (their registries at the commits docs/evidence.md names)
  trains as the package's strategy of its family, on the device type it names
  (:mod:`lightning_anyaccel.wiring.vendor_names`); with another accelerator, or a name whose word is no
  strategy here, the refusal names the package's spelling;
- ``SingleHPUStrategy()`` without a device: the package's one-device strategy takes its device from the
  accelerator in the Trainer and in Fabric, and alone says how to give it one;
- teco's ``"fp16-mixed"`` is in ``tests/test_habana_forms.py`` (refused, naming ``"16-mixed"``).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from lightning import Fabric, Trainer
from lightning.fabric.utilities.exceptions import MisconfigurationException

import lightning_anyaccel  # noqa: F401  (registers names)
from fakes import install_fake_device
from lightning_anyaccel import _lightning
from lightning_anyaccel.fabric import AnySingleDeviceStrategy as FabricSingleDeviceStrategy
from lightning_anyaccel.strategies.families import FAMILIES
from lightning_anyaccel.wiring.policy import StrategyNotSupportedError
from lightning_anyaccel.wiring.vendor_names import vendor_strategy

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)

#: What lightning-habana (5549fa9) and lightning-teco (ac21e3c) register -> the package's name it trains as.
VENDOR_TRAINER_NAMES = {
    "hpu_single": "any_single", "hpu_parallel": "any_ddp", "hpu_ddp": "any_ddp", "hpu_fsdp": "any_fsdp",
    "hpu_deepspeed": "any_deepspeed", "hpu_deepspeed_stage_1": "any_deepspeed_stage_1",
    "hpu_deepspeed_stage_2": "any_deepspeed_stage_2", "hpu_deepspeed_stage_2_offload": "any_deepspeed_stage_2_offload",
    "hpu_deepspeed_stage_3": "any_deepspeed_stage_3", "hpu_deepspeed_stage_3_offload": "any_deepspeed_stage_3_offload",
    "single_sdaa": "any_single", "dpp_sdaa": "any_ddp", "ddp_sdaa_find_unused_parameters_false": "any_ddp",
    "sdaa_fsdp": "any_fsdp", "sdaa_deepspeed": "any_deepspeed", "sdaa_deepspeed_stage_2": "any_deepspeed_stage_2",
    "sdaa_deepspeed_stage_3_offload": "any_deepspeed_stage_3_offload",
}
#: lightning-habana's Fabric registry.
VENDOR_FABRIC_NAMES = {"single_hpu": "any_single", "hpu_parallel": "any_ddp", "hpu_ddp": "any_ddp", "hpu_fsdp": "any_fsdp"}
#: Registered by the vendors, refused here, naming the package's names.
REFUSED = ("hpu_deepspeed_stage_3_offload_nvme", "sdaa_deepspeed_stage_3_offload_nvme")


def _registered_class(name: str, side: str = "trainer") -> type:
    family = next(f for f in FAMILIES if name in f.names)
    return family.trainer if side == "trainer" else family.fabric


def test_every_vendor_name_maps_to_its_family() -> None:
    for name, ours in {**VENDOR_TRAINER_NAMES, **VENDOR_FABRIC_NAMES}.items():
        device_type = next(t for t in ("hpu", "sdaa") if t in name.split("_"))
        assert vendor_strategy(name) == (device_type, ours), name
    for name in REFUSED:
        assert vendor_strategy(name)[1] is None, name
    assert vendor_strategy("ddp") is None and vendor_strategy("any_ddp") is None


@pytest.mark.parametrize("name", sorted(VENDOR_TRAINER_NAMES))
def test_trainer_takes_the_vendor_name(monkeypatch, name) -> None:
    # a faked device must be a type torch knows (hpu): teco's names are spelled with it (dpp_sdaa -> dpp_hpu);
    # the rule reads the device type from the name either way (test_every_vendor_name_maps_to_its_family)
    ours = VENDOR_TRAINER_NAMES[name]
    name, device_type = name.replace("sdaa", "hpu"), "hpu"
    install_fake_device(monkeypatch, device_type, count=2, backend="hccl")
    if "deepspeed" in name:
        pytest.importorskip("deepspeed")
    devices = 1 if ours == "any_single" else 2
    trainer = Trainer(strategy=name, devices=devices, **QUIET)  # the vendor's strategy brought its accelerator
    assert type(trainer.strategy) is _registered_class(ours)
    assert trainer.accelerator.device_type == device_type
    assert trainer.strategy.root_device.type == device_type
    same = Trainer(accelerator=device_type, strategy=name, devices=devices, **QUIET)
    assert type(same.strategy) is type(trainer.strategy)


@pytest.mark.parametrize("name", sorted(VENDOR_FABRIC_NAMES))
def test_fabric_takes_the_vendor_name(monkeypatch, name) -> None:
    install_fake_device(monkeypatch, "hpu", count=2, backend="hccl")
    fabric = Fabric(strategy=name, devices=1 if VENDOR_FABRIC_NAMES[name] == "any_single" else 2)
    assert type(fabric.strategy) is _registered_class(VENDOR_FABRIC_NAMES[name], "fabric")
    assert fabric.device.type == "hpu"


def test_a_vendor_name_on_another_device_is_refused_naming_ours() -> None:
    with pytest.raises(StrategyNotSupportedError, match=r"Pass strategy='any_ddp' to train on 'cpu', or accelerator='hpu'"):
        Trainer(accelerator="cpu", strategy="hpu_parallel", **QUIET)
    with pytest.raises(StrategyNotSupportedError, match=r"Pass strategy='any_fsdp' .* or accelerator='sdaa'"):
        Fabric(accelerator="cpu", strategy="sdaa_fsdp")
    for name in (*REFUSED, "hpu_frobnicate"):  # a made-up word is refused like the vendors' nvme offload
        with pytest.raises(StrategyNotSupportedError, match=r"pass one of 'any_single', 'any_ddp'"):
            Trainer(strategy=name, **QUIET)
    with pytest.raises(ValueError, match="invalid strategy name"):  # no device type in it: Lightning's own refusal
        Trainer(accelerator="cpu", strategy="frob_ddp", **QUIET)


def test_lightning_passes_the_flags_by_keyword() -> None:
    """The renaming hook reads ``strategy`` and ``accelerator`` from the keywords Lightning calls it with."""
    for distribution in (d for d in _lightning.DISTRIBUTIONS if d.is_installed()):
        for connector in (_lightning.TRAINER_CONNECTOR, _lightning.FABRIC_CONNECTOR):
            module, _, name = connector.rpartition(".")
            source = inspect.getsource(getattr(distribution.module(module), name).__init__)
            assert "self._check_config_and_set_final_flags(\n            strategy=strategy,\n            accelerator=accelerator," in source, (
                distribution.package, connector)


def test_one_device_strategy_takes_the_accelerators_device(monkeypatch) -> None:
    """``SingleHPUStrategy()`` had ``hpu`` built in; the package's takes it from the accelerator, or says so."""
    install_fake_device(monkeypatch, "hpu", count=2, backend="hccl")
    fabric = Fabric(accelerator="hpu", devices=1, strategy=FabricSingleDeviceStrategy())
    assert fabric.device == torch.device("hpu", 0)
    trainer = Trainer(accelerator="hpu", devices=1, strategy=lightning_anyaccel.AnySingleDeviceStrategy(), **QUIET)
    assert trainer.strategy.root_device == torch.device("hpu", 0)
    with pytest.raises(MisconfigurationException, match=r"has no device yet: pass it with an accelerator, or give one"):
        FabricSingleDeviceStrategy().root_device  # noqa: B018
    assert FabricSingleDeviceStrategy(torch.device("hpu")).root_device.type == "hpu"
