"""lightning-habana's arguments and habits, as its users' code and tests use them (issue 20).

Each form works or is refused when the Trainer/Fabric is built, with the fix:

- unnumbered ``parallel_devices=[torch.device("hpu")] * 8``: numbered by local rank (trained for real
  with two processes in ``tests/test_trainer_cpu.py::test_ddp_two_processes[trainer-any_ddp_spawn]``);
- one card per process on Gaudi: every rank's device is ``hpu:0`` (simulated: no Gaudi here);
- ``get_parallel_devices(2)``, ``ValueError`` for a wrong device type, ``process_group_backend`` after
  construction: on the device under test (``--device emulated:npu`` runs them on the emulated device);
- ``precision="16-mixed"``'s GradScaler and the option that matches habana's (no scaler): trained on
  the device under test;
- DeepSpeed's inference arguments: ``trainer.predict`` with tensor parallelism, two processes on CPU, also
  with a Trainer precision other than the engine's dtype; a fit whose ``configure_optimizers`` returns
  ``None`` is refused as habana's strategy refuses it;
- FSDP's ``bf16-mixed`` dtypes (Lightning's, and habana's through ``mixed_precision=``), habana's ``"bf16"``
  and teco's ``"fp16-mixed"`` (refused, naming ``"16-mixed"``): the migration page's differences.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from lightning import Fabric, Trainer
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins import MixedPrecision

import lightning_anyaccel  # noqa: F401  (registers names)
from conftest import ROOT
from fakes import install_fake_device
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDDPStrategy,
    AnyDeepSpeedStrategy,
    AnySingleDeviceStrategy,
    DeviceCountError,
    DeviceTypeError,
    ShardingNotSupportedError,
    get_spec,
)
from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDPStrategy
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])")


# ----- 1. unnumbered parallel_devices ----------------------------------------------------------------


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_unnumbered_parallel_devices_are_numbered_by_local_rank(device) -> None:
    if device.is_cpu:
        pytest.skip("CPU devices have no index")
    strategy = AnyDDPStrategy(parallel_devices=[torch.device(device.type)] * 2)
    per_rank = [0, 0] if get_spec(device.type).process_device_env else [0, 1]  # Gaudi: every process's card is hpu:0
    assert strategy.parallel_devices == [torch.device(device.type, i) for i in per_rank]
    trainer = Trainer(accelerator=device.type, strategy=strategy, devices=2, **QUIET)
    assert trainer.strategy.root_device == torch.device(device.type, 0)
    fabric = Fabric(accelerator=device.type, devices=2,
                    strategy=FabricDDPStrategy(parallel_devices=[torch.device(device.type)] * 2))
    assert fabric.strategy.parallel_devices == strategy.parallel_devices
    with pytest.raises(DeviceCountError, match=r"numbers some devices and not others.*\* 2 numbers them by local rank"):
        AnyDDPStrategy(parallel_devices=[torch.device(device.type, 0), torch.device(device.type)])
    assert AnySingleDeviceStrategy(device=torch.device(device.type)).root_device == torch.device(device.type, 0)


# ----- 5. one card per process (Gaudi) ------------------------------------------------------------------


def test_every_gaudi_rank_binds_hpu_0(monkeypatch) -> None:
    """Intel Gaudi: each process sees only the card HCCL gave its local rank (HABANA_VISIBLE_MODULES), as hpu:0."""
    fake = install_fake_device(monkeypatch, "hpu", count=8, backend="hccl")
    forms = {
        "readme": dict(accelerator="hpu", devices=8),
        "habana-docs": dict(accelerator=AnyAccelerator("hpu"), devices=8,
                            strategy=AnyDDPStrategy(parallel_devices=[torch.device("hpu")] * 8)),
        "numbered": dict(accelerator="hpu", devices=8,
                         strategy=AnyDDPStrategy(parallel_devices=[torch.device("hpu", i) for i in range(8)])),
    }
    for name, flags in forms.items():
        strategy = Trainer(**flags, **QUIET).strategy
        for local_rank in range(8):
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
            assert strategy.root_device == torch.device("hpu", 0), (name, local_rank)
        before = len(fake.calls)
        strategy.accelerator.setup_device(strategy.root_device)
        # binds hpu:0 first (a global seed set by an earlier test is then applied to the device too)
        assert fake.calls[before] == ("set_device_index", 0), fake.calls[before:]
    with pytest.raises(DeviceCountError, match="set HABANA_VISIBLE_MODULES=2,3 and pass devices=2"):
        Trainer(accelerator="hpu", devices=[2, 3], **QUIET)
    with pytest.raises(DeviceCountError, match=r"is a count: pass devices=8 .*=\[torch.device\('hpu'\)\] \* 8"):
        AnyDDPStrategy(parallel_devices=8)  # HPUDeepSpeedStrategy(parallel_devices=8) in lightning-habana's docs


@needs_deepspeed
def test_every_gaudi_rank_gives_deepspeed_device_0(monkeypatch) -> None:
    install_fake_device(monkeypatch, "hpu", count=8, backend="hccl")
    strategy = Trainer(accelerator="hpu", devices=8, strategy=AnyDeepSpeedStrategy(stage=2), **QUIET).strategy
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert (strategy.root_device, strategy.device_rank) == (torch.device("hpu", 0), 0)


# ----- 3. small API differences -------------------------------------------------------------------------


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_get_parallel_devices_takes_a_count(device) -> None:
    cls = type(AnyAccelerator(device.type))
    assert cls.get_parallel_devices(2) == cls.get_parallel_devices(cls.parse_devices(2))
    assert len(cls.get_parallel_devices(2)) == 2 and {d.type for d in cls.get_parallel_devices(2)} == {device.type}


@pytest.mark.device_generic
def test_wrong_device_type_is_a_value_error_too(device) -> None:
    accelerator = AnyAccelerator(device.type)
    for caught in (ValueError, MisconfigurationException, DeviceTypeError):
        with pytest.raises(caught, match=r"was given the device meta\. Use a strategy on"):
            accelerator.setup_device(torch.device("meta"))


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_a_strategy_on_another_device_type_is_refused(device) -> None:
    with pytest.raises(DeviceTypeError, match="Leave the strategy's devices unset"):  # strategy and accelerator disagree
        Trainer(accelerator=device.type if not device.is_cpu else "any", devices=2,
                strategy=AnyDDPStrategy(parallel_devices=[torch.device("meta")] * 2), **QUIET)


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_process_group_backend_is_known_after_construction(device) -> None:
    assert AnyDDPStrategy().process_group_backend is None  # no device yet
    assert AnyDDPStrategy(process_group_backend="gloo").process_group_backend == "gloo"
    trainer = Trainer(accelerator=device.type if not device.is_cpu else "any", strategy=AnyDDPStrategy(), devices=2,
                      **QUIET)
    assert trainer.strategy.process_group_backend == device.backend
    fabric = Fabric(accelerator=device.type if not device.is_cpu else "any", strategy="any_ddp", devices=2)
    assert fabric.strategy.process_group_backend == device.backend


# ----- 4. 16-mixed: Lightning's GradScaler, or none as with lightning-habana ------------------------------


class _StepProbe(Callback):
    """Records, per training step, whether the optimizer changed the weights."""

    def __init__(self) -> None:
        self.updated: list[bool] = []
        self._before: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._before = [p.detach().clone() for p in pl_module.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.updated.append(any(not torch.equal(a, p) for a, p in zip(self._before, pl_module.parameters())))


class _LargeLoss(DemoModel):
    """A loss whose fp16 gradients overflow once multiplied by GradScaler's initial scale (2**16)."""

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * 1000


def _fit_16_mixed(device_type: str, **flags) -> tuple[Trainer, _StepProbe]:
    probe = _StepProbe()
    trainer = Trainer(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1, max_steps=3,
                      callbacks=[probe], **flags, **QUIET)
    trainer.fit(_LargeLoss(lr=1e-6), demo_loader())
    return trainer, probe


@pytest.mark.device_generic
@pytest.mark.feature("mixed_precision")
def test_16_mixed_skips_overflowing_steps_and_the_habana_option_does_not(device) -> None:
    lightning_default, scaled = _fit_16_mixed(device.type, precision="16-mixed")
    assert lightning_default.precision_plugin.scaler.is_enabled()
    assert scaled.updated[0] is False  # the first step overflowed at scale 2**16: skipped, scale lowered
    assert lightning_default.precision_plugin.scaler.get_scale() < 2.0**16
    # what docs/migration.md gives for lightning-habana's behaviour: fp16 autocast, no loss scaling
    habana = MixedPrecision("16-mixed", device.type, scaler=torch.amp.GradScaler(device.type, enabled=False))
    trainer, unscaled = _fit_16_mixed(device.type, plugins=[habana])
    assert trainer.precision_plugin is habana and trainer.precision_plugin.device == device.type
    assert trainer.lightning_module.autocast_seen == [(device.type, "float16")] * 3
    assert unscaled.updated == [True, True, True]


# ----- 2. DeepSpeed inference arguments ---------------------------------------------------------------------


@needs_deepspeed
def test_deepspeed_inference_arguments_are_taken_or_named() -> None:
    """habana's HPUDeepSpeedStrategy(**kwargs) forms: keywords, config keys; a typo is a TypeError naming the keys."""
    by_keyword = AnyDeepSpeedStrategy(tensor_parallel={"tp_size": 2}, dtype=torch.float, replace_with_kernel_inject=False)
    assert by_keyword.inference_kwargs == {"tensor_parallel": {"tp_size": 2}, "dtype": torch.float,
                                           "replace_with_kernel_inject": False}
    by_config = AnyDeepSpeedStrategy(config={"tensor_parallel": {"tp_size": 2}, "dtype": torch.float,
                                             "train_micro_batch_size_per_gpu": 1})
    assert by_config.inference_kwargs == {"tensor_parallel": {"tp_size": 2}, "dtype": torch.float}
    assert AnyDeepSpeedStrategy(stage=2).inference_kwargs == {}  # ZeRO's engine, as before
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['tensor_paralel'\].*tensor_parallel"):
        AnyDeepSpeedStrategy(tensor_paralel={"tp_size": 2})


@needs_deepspeed
def test_deepspeed_kernel_injection_is_refused_where_deepspeed_has_no_kernels() -> None:
    from lightning_anyaccel.strategies.deepspeed_checks import check_inference_support

    trainer = Trainer(accelerator="any", strategy=AnyDeepSpeedStrategy(replace_with_kernel_inject=True), devices=2,
                      **QUIET)
    with pytest.raises(ShardingNotSupportedError, match="inference kernels.*Pass replace_with_kernel_inject=False"):
        check_inference_support(trainer.strategy)


#: Each run: the form of the inference keys, the Trainer's precision, the engine's dtype (``deepspeed_inference.py``).
#: A precision other than the engine's: Lightning's DeepSpeed precision gives the inputs in bfloat16 under
#: ``bf16-mixed`` (float32 under ``32-true``), the engine holds its weights in its own dtype ("addmv input
#: tensors must have the same dtype, but got Float, BFloat16"). (A ``float16`` engine: DeepSpeed's CPU
#: accelerator refuses it on CPUs without fp16 arithmetic; the inputs follow the weights' dtype all the same.)
PREDICT_RUNS = ("config:bf16-mixed:float32", "kwargs:32-true:bfloat16")


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.feature("deepspeed")
def test_deepspeed_tensor_parallel_predict(python_runner, tmp_path) -> None:
    """``trainer.predict`` with habana's inference keywords (or the same keys in ``config=``): DeepSpeed splits the
    layers over 2 CPU processes and predicts what the unsplit model does, in the engine's dtype, also when the
    Trainer's precision is another one. The runs share one 2-process job."""
    script = str(ROOT / "tests" / "scripts" / "deepspeed_inference.py")
    env = {"ANYACCEL_DS_NO_SHM": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / "build" / "torch_extensions")}
    proc = python_runner([script, "--runs", ",".join(PREDICT_RUNS), "--out", str(tmp_path)], timeout=300, env=env)
    assert proc.returncode == 0, "\n".join(line for line in proc.stdout.splitlines() if "Warning" not in line)[-4000:]
    for run in PREDICT_RUNS:
        dtype = run.rsplit(":", 1)[1]
        ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / run.replace(":", "-")).glob("rank*.json"))]
        assert [r["rank"] for r in ranks] == [0, 1], run
        for rank in ranks:
            assert rank["engine"] == "InferenceEngine"
            assert rank["inner_weight"] == [8, 8]  # Linear(8, 16) split by output features over the 2 ranks
            assert rank["dtype"] == f"torch.{dtype}", run
            tolerance = {"rtol": 2e-2, "atol": 2e-2} if dtype == "bfloat16" else {}  # sums of partial products
            torch.testing.assert_close(torch.tensor(rank["predictions"]), torch.tensor(rank["expected"]), **tolerance)


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.feature("deepspeed")
def test_deepspeed_refuses_a_fit_without_optimizer(python_runner) -> None:
    """``configure_optimizers`` returning ``None``: Lightning's "invalid optimizer" error, not DeepSpeed's
    ``IndexError``."""
    script = str(ROOT / "tests" / "scripts" / "deepspeed_no_optimizer.py")
    proc = python_runner([script], timeout=300, env={"ANYACCEL_DS_NO_SHM": "1"})
    assert proc.returncode == 0, "\n".join(line for line in proc.stdout.splitlines() if "Warning" not in line)[-4000:]
    assert "refused: You have specified an invalid optimizer to be run with deepspeed" in proc.stdout
    assert "configure_optimizers" in proc.stdout.split("refused: ", 1)[1]  # names where to fix it


@pytest.mark.device_generic
def test_fsdp_keeps_habanas_bf16_dtypes_when_given_them(device) -> None:
    """``bf16-mixed`` under FSDP follows Lightning (all bf16); the form on the migration page keeps fp32 parameters."""
    from torch.distributed.fsdp import MixedPrecision as FSDPMixedPrecision

    from lightning_anyaccel import AnyFSDPStrategy

    accelerator = device.type if not device.is_cpu else "any"
    lightning_default = Trainer(accelerator=accelerator, devices=1, strategy=AnyFSDPStrategy(), precision="bf16-mixed",
                                **QUIET).strategy.mixed_precision_config
    assert (lightning_default.param_dtype, lightning_default.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    habana = FSDPMixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    kept = Trainer(accelerator=accelerator, devices=1, strategy=AnyFSDPStrategy(mixed_precision=habana),
                   precision="bf16-mixed", **QUIET).strategy.mixed_precision_config
    assert (kept.param_dtype, kept.reduce_dtype, kept.buffer_dtype) == (torch.float32, torch.bfloat16, torch.bfloat16)


def test_habanas_bf16_is_bf16_mixed() -> None:
    assert Trainer(accelerator="cpu", devices=1, precision="bf16", **QUIET).precision_plugin.precision == "bf16-mixed"


def test_teco_fp16_mixed_is_refused_naming_16_mixed() -> None:
    with pytest.raises(ValueError, match="'16-mixed'"):
        Trainer(accelerator="cpu", devices=1, precision="fp16-mixed", **QUIET)
