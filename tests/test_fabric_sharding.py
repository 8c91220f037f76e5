"""Sharded training with Lightning Fabric (FSDP, FSDP2, DeepSpeed) on CPU.

One real 2-process run (``tests/scripts/fabric_shard.py``) covers DDP as the reference, FSDP
with full and sharded checkpoints, FSDP2 with distributed and full checkpoints and, when
installed, DeepSpeed ZeRO-3; the rest is in-process: names, precision on the device type, and
bad combinations refused.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from lightning import Fabric
from lightning.fabric.plugins.precision import MixedPrecision
from lightning.fabric.strategies import fsdp as lightning_fsdp
from lightning.fabric.strategies import model_parallel as lightning_model_parallel

import lightning_anyaccel  # noqa: F401  (registers the names)
from lightning_anyaccel import ShardingNotSupportedError
from lightning_anyaccel.fabric import (
    AnyAccelerator,
    AnyDeepSpeedStrategy,
    AnyFabricFSDPPrecision,
    AnyFSDPStrategy,
    AnyModelParallelStrategy,
)
from lightning_anyaccel.strategies.sharding import AnyDeepSpeedMixin, AnyFSDPMixin, AnyModelParallelMixin

SCRIPT = Path(__file__).parent / "scripts" / "fabric_shard.py"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
#: Where DeepSpeed caches ops it compiles (none for ZeRO-3 on gloo; the Trainer tests share it).
ENV = {"TORCH_EXTENSIONS_DIR": str(Path(__file__).parents[1] / "build" / "torch_extensions")}


def _fabric(strategy, **kwargs) -> Fabric:
    return Fabric(accelerator=AnyAccelerator("cpu"), strategy=strategy, devices=2, **kwargs)


# ----- one real run: 2 processes, gloo --------------------------------------------------------

@pytest.mark.slow
def test_fabric_sharded_training_matches_ddp_and_reloads(python_runner, tmp_path) -> None:
    extra = ["--deepspeed"] if HAS_DEEPSPEED else []
    proc = python_runner([str(SCRIPT), "--out", str(tmp_path), *extra], timeout=240, env=ENV)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    ddp = [r["ddp"] for r in ranks]
    total = ddp[0]["total_numel"]
    assert [r["local_numel"] for r in ddp] == [total, total]
    assert ddp[0]["losses"] != ddp[1]["losses"]  # each rank saw its own half of the data

    expected = {  # configuration: (strategy class, checkpoint is a folder)
        "fsdp_full": ("AnyFSDPStrategy", False),
        "fsdp_sharded": ("AnyFSDPStrategy", True),
        "fsdp2_sharded": ("AnyModelParallelStrategy", True),
        "fsdp2_full": ("AnyModelParallelStrategy", False),
    }
    if HAS_DEEPSPEED:
        expected["deepspeed_3"] = ("AnyDeepSpeedStrategy", True)
    for name, (strategy, folder) in expected.items():
        got = [r[name] for r in ranks]
        assert {g["strategy"] for g in got} == {f"lightning_anyaccel.fabric.strategies.{strategy}"}, name
        held = [g["local_numel"] for g in got]
        assert all(n < 0.6 * total for n in held) and sum(held) >= total, (name, held, total)
        for g, reference in zip(got, ddp):
            torch.testing.assert_close(g["losses"], reference["losses"], rtol=1e-4, atol=1e-5, msg=name)
            # the reloaded model and optimizer replay the last steps exactly (momentum restored)
            torch.testing.assert_close(g["resumed_losses"], g["losses"][3:], rtol=0, atol=1e-6, msg=name)
            assert g["resumed_weights_difference"] < 1e-6, name
            assert g["loaded_step"] == 3, name
            assert g["checkpoint_is_dir"] is folder, name
    assert {r["fsdp2_sharded"]["mesh_device_type"] for r in ranks} == {"cpu"}
    assert {r["hybrid_mesh_device_type"] for r in ranks} == {"cpu"}  # Lightning builds the tuple on "cuda"


# ----- in-process ---------------------------------------------------------------------------

NAMES = [("any_fsdp", AnyFSDPStrategy), ("any_fsdp_cpu_offload", AnyFSDPStrategy),
         ("any_fsdp2", AnyModelParallelStrategy)]
if HAS_DEEPSPEED:
    NAMES += [("any_deepspeed", AnyDeepSpeedStrategy), ("any_deepspeed_stage_3_offload", AnyDeepSpeedStrategy)]


@pytest.mark.parametrize("name, cls", NAMES)
def test_fabric_sharded_names_share_the_trainer_logic(name, cls) -> None:
    strategy = _fabric(name).strategy
    assert type(strategy) is cls and strategy.root_device == torch.device("cpu")
    mixin = {AnyFSDPStrategy: AnyFSDPMixin, AnyModelParallelStrategy: AnyModelParallelMixin,
             AnyDeepSpeedStrategy: AnyDeepSpeedMixin}[cls]
    trainer_class = getattr(lightning_anyaccel, cls.__name__)
    assert isinstance(strategy, mixin) and issubclass(trainer_class, mixin)  # one body, two front ends
    if cls is AnyFSDPStrategy:
        assert strategy._fsdp_wrap_kwargs()["device_id"] == torch.device("cpu")  # Lightning: index None
        assert strategy.cpu_offload.offload_params is name.endswith("offload")


@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_fabric_fsdp_precision_on_the_device(precision, dtype) -> None:
    fabric = _fabric("any_fsdp", precision=precision)
    plugin = fabric.strategy.precision
    assert type(plugin) is AnyFabricFSDPPrecision and plugin.device == "cpu"
    assert fabric._precision is plugin  # rebuilt before Fabric caches it (fabric.autocast() uses the cache)
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert not torch.is_autocast_enabled("cuda")
    if precision == "16-mixed":
        assert plugin.scaler._device == "cpu"  # Fabric's ShardedGradScaler() would be "cuda"
    else:
        assert plugin.scaler is None


def test_fabric_fsdp2_precision_on_the_device() -> None:
    fabric = _fabric("any_fsdp2", precision="bf16-mixed")
    plugin = fabric.strategy.precision
    assert isinstance(plugin, MixedPrecision) and plugin.device == "cpu" and fabric._precision is plugin


def test_fabric_fsdp_full_state_offload_on_cpu_is_refused() -> None:
    with pytest.raises(ShardingNotSupportedError, match=r"AnyFSDPStrategy\(state_dict_offload=True, state_dict_type="
                                                        r"'full'\) on CPU.*crashes.*21804.*state_dict_type='sharded'"):
        _fabric(AnyFSDPStrategy(state_dict_type="full", state_dict_offload=True))


def test_fabric_fsdp_full_state_helper_follows_the_table() -> None:
    """Fabric's checkpoint code gathers through our helper (no CPU offload on CPU) only while it runs."""
    strategy = _fabric(AnyFSDPStrategy(state_dict_type="full")).strategy
    assert strategy.state_dict_offload is False
    originals = lightning_fsdp._get_full_state_dict_context, lightning_model_parallel._get_full_state_dict_context
    with strategy._lightning_full_state_dict():
        assert lightning_fsdp._get_full_state_dict_context is lightning_model_parallel._get_full_state_dict_context
        assert lightning_fsdp._get_full_state_dict_context is not originals[0]
    assert (lightning_fsdp._get_full_state_dict_context, lightning_model_parallel._get_full_state_dict_context) == originals


@pytest.mark.parametrize("strategy_class", [AnyFSDPStrategy, AnyModelParallelStrategy])
def test_fabric_sharding_on_mps_is_refused(strategy_class) -> None:
    strategy = strategy_class(tensor_parallel_size=1) if strategy_class is AnyModelParallelStrategy else strategy_class()
    strategy.parallel_devices = [torch.device("mps", 0)] * 2
    with pytest.raises(ShardingNotSupportedError, match=r"splits the model across processes, but Apple GPU \(MPS\)"
                                                        r" \('mps'\) has no collective backend.*any_single"):
        strategy._validate_device_setup()


def test_fabric_model_parallel_without_parallelize_fn_is_refused() -> None:
    with pytest.raises(ShardingNotSupportedError, match=r"tensor_parallel_size='auto'\) needs your parallelize_fn.*"
                                                        r"parallelize_fn=\.\.\..*'any_fsdp2'"):
        _fabric("any_model_parallel")
    assert type(_fabric(AnyModelParallelStrategy(lambda m, mesh: m)).strategy) is AnyModelParallelStrategy


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed")
def test_fabric_deepspeed_checks(monkeypatch) -> None:
    strategy = _fabric("any_deepspeed_stage_2").strategy
    assert strategy.device_rank == strategy.local_rank == 0  # Lightning passes root_device.index: None
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ShardingNotSupportedError, match=r"DS_ACCELERATOR='cuda' is set, but the strategy trains on"
                                                        r" 'cpu'\. Unset DS_ACCELERATOR or set it to 'cpu'"):
        _fabric("any_deepspeed_stage_2")
