"""Sharded strategies: bad combinations fail fast with a message naming the fix; precision on the device type."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from lightning import Trainer

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDeepSpeedStrategy,
    AnyFSDPPrecision,
    AnyFSDPStrategy,
    AnyModelParallelStrategy,
    DeepSpeedNotInstalledError,
    ShardingNotSupportedError,
)

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])",
)


def _trainer(**kwargs):
    return Trainer(accelerator=AnyAccelerator(), devices=2, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, **kwargs)


@pytest.mark.parametrize("strategy_class", [AnyFSDPStrategy, AnyModelParallelStrategy])
def test_fsdp_on_mps_is_refused(strategy_class):
    strategy = strategy_class()
    strategy.parallel_devices = [torch.device("mps", 0)] * 2
    with pytest.raises(ShardingNotSupportedError, match=r"splits the model across processes, but Apple GPU \(MPS\)"
                                                        r" \('mps'\) has no collective backend.*any_single"):
        strategy._validate_device_setup()


def test_fsdp_full_state_offload_on_cpu_is_refused():
    with pytest.raises(ShardingNotSupportedError, match=r"state_dict_offload=True.*CPU.*crashes.*21804.*sharded"):
        _trainer(strategy=AnyFSDPStrategy(state_dict_offload=True))


def test_fsdp_full_state_offload_follows_the_table():
    assert _trainer(strategy="any_fsdp").strategy.state_dict_offload is False
    strategy = AnyFSDPStrategy()
    strategy.parallel_devices = [torch.device("xpu", 0)]
    assert strategy.state_dict_offload is True


@pytest.mark.parametrize("name", ["any_fsdp", "any_fsdp2", "any_model_parallel", "any_deepspeed_stage_3"])
def test_lightnings_cuda_only_check_does_not_refuse_our_names(name):
    if "deepspeed" in name and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    assert _trainer(strategy=name).strategy.root_device.type == "cpu"


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_fsdp_precision_autocasts_on_the_strategy_device(precision, dtype):
    plugin = _trainer(strategy="any_fsdp", precision=precision).strategy.precision_plugin
    assert isinstance(plugin, AnyFSDPPrecision)
    assert plugin.device == "cpu"
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert not torch.is_autocast_enabled("cuda")
    if precision == "16-mixed":
        assert plugin.scaler._device == "cpu"  # Lightning's ShardedGradScaler() would be "cuda"
    else:
        assert plugin.scaler is None


def test_fsdp2_precision_is_aligned_to_the_device():
    plugin = _trainer(strategy="any_fsdp2", precision="bf16-mixed").strategy.precision_plugin
    assert plugin.device == "cpu"


def test_deepspeed_missing_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(DeepSpeedNotInstalledError, match=r"lightning-anyaccel\[deepspeed\].*any_fsdp"):
        AnyDeepSpeedStrategy()


@needs_deepspeed
def test_deepspeed_on_a_device_it_does_not_know():
    strategy = AnyDeepSpeedStrategy()
    strategy.parallel_devices = [torch.device("mps", 0)] * 2
    with pytest.raises(ShardingNotSupportedError, match=r"DeepSpeed is not enabled for Apple GPU \(MPS\) \('mps'\) in the device table; it runs on"
                                                        r" cpu, cuda, hpu, npu, xpu\. Use strategy='any_fsdp'"):
        strategy._validate_device_setup()


@needs_deepspeed
def test_deepspeed_accelerator_conflict(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ShardingNotSupportedError, match=r"DS_ACCELERATOR='cuda' is set, but the strategy trains on"
                                                        r" 'cpu'\. Unset DS_ACCELERATOR or set it to 'cpu'"):
        _trainer(strategy="any_deepspeed_stage_2")


@needs_deepspeed
def test_deepspeed_device_rank_on_cpu_is_the_local_rank():
    strategy = _trainer(strategy="any_deepspeed").strategy
    assert strategy.root_device.index is None  # what Lightning hands DeepSpeed: a TypeError inside it
    assert strategy.device_rank == strategy.local_rank == 0


def test_deepspeed_refuses_a_device_without_its_vendor_package(monkeypatch) -> None:
    """DeepSpeed's accelerator for a vendor device imports the vendor package; without it, refuse before starting."""
    import dataclasses

    from lightning_anyaccel.devices import get_spec
    from lightning_anyaccel.strategies import AnyDeepSpeedStrategy, ShardingNotSupportedError
    from lightning_anyaccel.strategies import deepspeed, sharded

    strategy = AnyDeepSpeedStrategy(stage=2, parallel_devices=[torch.device("cpu")] * 2)
    spec = dataclasses.replace(get_spec("cpu"), vendor_module="not_an_installed_vendor.torch")
    monkeypatch.setattr(sharded.AnyShardedMixin, "_spec", property(lambda self: spec))
    with pytest.raises(ShardingNotSupportedError, match="needs `not_an_installed_vendor.torch`, which is not installed"):
        deepspeed.check_vendor_package(strategy)


def test_fsdp_norm_clipping_without_an_fsdp_root_names_the_fix():
    """Clipping by norm needs the root FSDP module (the strategy sets it); without one, the error says what to do."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    from lightning_anyaccel import AnyFSDPPrecision

    plugin = AnyFSDPPrecision("32-true", device="cpu")
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(MisconfigurationException, match="auto_wrap_policy"):
        plugin.clip_grad_by_norm(optimizer, 1.0)
