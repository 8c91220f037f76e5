"""Sharded strategies in-process, through both front ends: bad combinations fail fast with a message
naming the fix; precision on the device type; the names build the package's strategies.

A behaviour both front ends have is one test parameterised by front end (``front_ends.py``). The
real 2-process runs are in ``test_sharding_cpu.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
from unittest.mock import patch

import pytest
import torch
from lightning.fabric.strategies import fsdp as lightning_fsdp
from lightning.fabric.strategies import model_parallel as lightning_model_parallel

import lightning_anyaccel  # noqa: F401  (registers names)
from front_ends import EVERY_FRONT_END, FRONT_ENDS, FrontEndCase
from lightning_anyaccel import (
    AnyDeepSpeedStrategy,
    AnyFSDPPrecision,
    DeepSpeedNotInstalledError,
    ShardingNotSupportedError,
)
from lightning_anyaccel import fabric as anyaccel_fabric
from lightning_anyaccel._lightning import accessors as lightning_accessors
from lightning_anyaccel.device.devices import DEVICE_TABLE
from lightning_anyaccel.strategies.deepspeed import AnyDeepSpeedMixin
from lightning_anyaccel.strategies.families import refusal
from lightning_anyaccel.strategies.fsdp import AnyFSDPMixin
from lightning_anyaccel.strategies.model_parallel import AnyModelParallelMixin

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])",
)
#: The FSDP precision plugin of each front end.
#: The name of the FSDP precision class in each front end's package.
FSDP_PRECISION = {"trainer": "AnyFSDPPrecision", "fabric": "AnyFabricFSDPPrecision"}


def _build(front_end: FrontEndCase, strategy, **flags):
    """The front end on 2 CPU processes (nothing is started)."""
    return front_end.build(accelerator=front_end.package.AnyAccelerator("cpu"), strategy=strategy, devices=2, **flags)


# ----- devices and names ---------------------------------------------------------------------------

@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("family, kwargs", [
    pytest.param("AnyFSDPStrategy", {}, id="AnyFSDPStrategy"),
    pytest.param("AnyModelParallelStrategy", {}, id="AnyModelParallelStrategy"),
    pytest.param("AnyModelParallelStrategy", {"tensor_parallel_size": 1}, id="AnyModelParallelStrategy-tp1"),
])
def test_fsdp_on_mps_is_refused(front_end: FrontEndCase, family, kwargs):
    strategy = getattr(front_end.package, family)(**kwargs)
    strategy.parallel_devices = [torch.device("mps", 0)] * 2
    with pytest.raises(ShardingNotSupportedError, match=r"splits the model across processes, but Apple GPU \(MPS\)"
                                                        r" \('mps'\) has no collective backend.*any_single"):
        strategy._validate_device_setup()


@pytest.mark.parametrize("name", ["any_fsdp", "any_fsdp2", "any_model_parallel", "any_deepspeed_stage_3"])
def test_lightnings_cuda_only_check_does_not_refuse_our_names(name):
    from front_ends import TRAINER

    if "deepspeed" in name and not HAS_DEEPSPEED:
        pytest.skip("deepspeed is not installed")
    assert _build(TRAINER, name).strategy.root_device.type == "cpu"


FABRIC_NAMES = [("any_fsdp", "AnyFSDPStrategy"), ("any_fsdp2", "AnyModelParallelStrategy")]
if HAS_DEEPSPEED:
    FABRIC_NAMES += [("any_deepspeed", "AnyDeepSpeedStrategy"), ("any_deepspeed_stage_3_offload", "AnyDeepSpeedStrategy")]


@pytest.mark.parametrize("name, family", FABRIC_NAMES)
def test_fabric_sharded_names_share_the_trainer_logic(name, family) -> None:
    from front_ends import FABRIC

    cls = getattr(anyaccel_fabric, family)
    strategy = _build(FABRIC, name).strategy
    assert type(strategy) is cls and strategy.root_device == torch.device("cpu")
    mixin = {"AnyFSDPStrategy": AnyFSDPMixin, "AnyModelParallelStrategy": AnyModelParallelMixin,
             "AnyDeepSpeedStrategy": AnyDeepSpeedMixin}[family]
    trainer_class = getattr(lightning_anyaccel, family)
    assert isinstance(strategy, mixin) and issubclass(trainer_class, mixin)  # one body, two front ends
    if family == "AnyFSDPStrategy":
        assert strategy._fsdp_wrap_kwargs()["device_id"] == torch.device("cpu")  # Lightning: index None


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_fsdp_cpu_offload_on_cpu_is_refused(front_end: FrontEndCase):
    """``any_fsdp_cpu_offload`` on CPU would fail in every rank's first step (torch pins the offloaded shards, which
    needs an accelerator): refused when the front end is built, naming the strategy to use. It trains on the
    device under test (test_sharding_cpu.py::test_parameters_sharded_on_the_device_under_test[fsdp_offload])."""
    with pytest.raises(ShardingNotSupportedError, match=r"AnyFSDPStrategy\(cpu_offload=True\) \(the name"
                                                        r" 'any_fsdp_cpu_offload'\) on CPU.*strategy='any_fsdp'"):
        _build(front_end, "any_fsdp_cpu_offload")


# ----- FSDP's full state dict on CPU -------------------------------------------------------------------

@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_fsdp_full_state_offload_on_cpu_is_refused(front_end: FrontEndCase):
    strategy = front_end.package.AnyFSDPStrategy(state_dict_type="full", state_dict_offload=True)
    with pytest.raises(ShardingNotSupportedError, match=r"AnyFSDPStrategy\(state_dict_offload=True, state_dict_type="
                                                        r"'full'\) on CPU.*crashes.*21804.*state_dict_type='sharded'") \
            as raised:
        _build(front_end, strategy)
    raised.match(r"state_dict_offload=True.*CPU.*crashes.*21804.*sharded")


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_fsdp_full_state_offload_follows_the_table(front_end: FrontEndCase):
    assert _build(front_end, "any_fsdp").strategy.state_dict_offload is False
    full = front_end.package.AnyFSDPStrategy(state_dict_type="full")
    assert _build(front_end, full).strategy.state_dict_offload is False
    strategy = front_end.package.AnyFSDPStrategy()
    strategy.parallel_devices = [torch.device("xpu", 0)]
    assert strategy.state_dict_offload is True


def test_fabric_fsdp_full_state_helper_follows_the_table() -> None:
    """Fabric's checkpoint code gathers through our helper (no CPU offload on CPU) only while it runs, and only
    in the thread that runs it: a save in another thread meanwhile gets Lightning's own helper."""
    from front_ends import FABRIC

    strategy = _build(FABRIC, anyaccel_fabric.AnyFSDPStrategy(state_dict_type="full")).strategy
    calls: list[tuple[str, bool]] = []

    def lightning_helper(module, world_size=1, rank0_only=True):
        calls.append(("lightning", rank0_only))
        return contextlib.nullcontext()

    def ours(module, rank0_only=True):
        calls.append(("package", rank0_only))
        return contextlib.nullcontext()

    module = torch.nn.Linear(2, 2)
    with patch.object(lightning_fsdp, "_get_full_state_dict_context", lightning_helper), \
            patch.object(lightning_model_parallel, "_get_full_state_dict_context", lightning_helper), \
            patch.object(lightning_accessors, "_FULL_STATE_DICT_DISPATCHING", set()), \
            patch.object(strategy, "_full_state_dict_context", ours):
        with strategy._lightning_full_state_dict():
            lightning_fsdp._get_full_state_dict_context(module, 2, rank0_only=False)
            lightning_model_parallel._get_full_state_dict_context(module, 2)
            other = threading.Thread(target=lambda: lightning_fsdp._get_full_state_dict_context(module, 2))
            other.start()
            other.join(timeout=30)
        lightning_fsdp._get_full_state_dict_context(module, 2)
    assert calls == [("package", False), ("package", True), ("lightning", True), ("lightning", True)]


# ----- precision on the device type ---------------------------------------------------------------------

@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("precision, dtype", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)])
def test_fsdp_precision_autocasts_on_the_strategy_device(front_end: FrontEndCase, precision, dtype):
    built = _build(front_end, "any_fsdp", precision=precision)
    plugin = front_end.strategy_precision(built)
    assert type(plugin) is getattr(front_end.package, FSDP_PRECISION[front_end.side])
    assert plugin.device == "cpu"
    # rebuilt before the front end took it (Fabric caches it: fabric.autocast() uses the cache)
    assert front_end.precision(built) is plugin
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype
        assert not torch.is_autocast_enabled("cuda")
    if precision == "16-mixed":
        assert plugin.scaler._device == "cpu"  # Lightning's ShardedGradScaler() would be "cuda"
    else:
        assert plugin.scaler is None


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_fsdp2_precision_is_aligned_to_the_device(front_end: FrontEndCase):
    built = _build(front_end, "any_fsdp2", precision="bf16-mixed")
    plugin = front_end.strategy_precision(built)
    assert isinstance(plugin, front_end.mixed_precision) and plugin.device == "cpu"
    assert front_end.precision(built) is plugin


def test_fsdp_norm_clipping_without_an_fsdp_root_names_the_fix():
    """Clipping by norm needs the root FSDP module (the strategy sets it); without one, the error says what to do."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    plugin = AnyFSDPPrecision("32-true", device="cpu")
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(MisconfigurationException, match="auto_wrap_policy"):
        plugin.clip_grad_by_norm(optimizer, 1.0)


# ----- model parallel ----------------------------------------------------------------------------------

def test_fabric_model_parallel_without_parallelize_fn_is_refused() -> None:
    from front_ends import FABRIC

    with pytest.raises(ShardingNotSupportedError, match=r"tensor_parallel_size='auto'\) needs your parallelize_fn.*"
                                                        r"parallelize_fn=\.\.\..*'any_fsdp2'"):
        _build(FABRIC, "any_model_parallel")
    strategy = anyaccel_fabric.AnyModelParallelStrategy(lambda m, mesh: m)
    assert type(_build(FABRIC, strategy).strategy) is anyaccel_fabric.AnyModelParallelStrategy


# ----- DeepSpeed ---------------------------------------------------------------------------------------

def test_deepspeed_missing_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(DeepSpeedNotInstalledError, match=r"lightning-anyaccel\[deepspeed\].*any_fsdp"):
        AnyDeepSpeedStrategy()


@needs_deepspeed
@pytest.mark.parametrize(("device_type", "refusal"), [
    ("mtia", r"DeepSpeed has no accelerator for 'mtia' \(it has: cuda, cpu, xpu, npu, .*\)\. Use strategy='any_fsdp'"),
    ("mps", r"DeepSpeed's 'mps' accelerator can not start here: MPS_Accelerator requires torch\.mps.*any_fsdp"),
])
def test_deepspeed_on_a_device_it_does_not_run_on(device_type, refusal):
    """DeepSpeed's own list (mtia is not in it) and its own probe (mps: listed, but no MPS here) decide."""
    strategy = AnyDeepSpeedStrategy()
    strategy.parallel_devices = [torch.device(device_type, 0)] * 2
    with pytest.raises(ShardingNotSupportedError, match=refusal):
        strategy._validate_device_setup()


@needs_deepspeed
@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_deepspeed_accelerator_conflict(monkeypatch, front_end: FrontEndCase):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ShardingNotSupportedError, match=r"DS_ACCELERATOR='cuda' is set, but the strategy trains on"
                                                        r" 'cpu'\. Unset DS_ACCELERATOR or set it to 'cpu'"):
        _build(front_end, "any_deepspeed_stage_2")


@needs_deepspeed
@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize("name", ["any_deepspeed", "any_deepspeed_stage_2"])
def test_deepspeed_device_rank_on_cpu_is_the_local_rank(front_end: FrontEndCase, name):
    strategy = _build(front_end, name).strategy
    assert strategy.root_device.index is None  # what Lightning hands DeepSpeed: a TypeError inside it
    assert strategy.device_rank == strategy.local_rank == 0


@needs_deepspeed
@pytest.mark.parametrize(("device_type", "package", "install"), [
    ("sdaa", "torch_sdaa", "Teco's torch_sdaa package"), ("mlu", "torch_mlu", "Cambricon's torch_mlu package"),
    ("npu", "torch_npu", "Ascend CANN, then the torch_npu release")])
def test_deepspeed_refuses_a_device_without_its_vendor_package(device_type, package, install) -> None:
    """DeepSpeed's accelerator for a vendor device imports the vendor package; without it (a device of the type
    from another backend), the launching process refuses before any worker starts, naming the package."""
    from types import SimpleNamespace

    from lightning_anyaccel.strategies.deepspeed_checks import check_deepspeed_support

    with pytest.raises(ShardingNotSupportedError, match=rf"DeepSpeed's '{device_type}' accelerator can not start"
                       rf" here: .* requires {package}, which is not installed.* Install {install}.*any_fsdp"):
        check_deepspeed_support(SimpleNamespace(device_type=device_type))


@needs_deepspeed
@pytest.mark.parametrize("device_type", sorted(DEVICE_TABLE))
def test_deepspeed_refuses_exactly_where_the_pages_say(monkeypatch, device_type: str) -> None:
    """The DeepSpeed strategy's checks before any process starts refuse a device type (with its vendor's package
    installed) exactly where ``strategies.families.refusal`` (what the device pages, the grid and the migration page
    show) says they do."""
    from types import SimpleNamespace

    from lightning_anyaccel.strategies import support
    from lightning_anyaccel.strategies.deepspeed import SETUP

    monkeypatch.setattr(support, "_probe", lambda name: None)  # the vendor's package imports, as on its machines
    spec = DEVICE_TABLE[device_type]
    target = SimpleNamespace(spec=spec, device_type=spec.type, sharding_name="DeepSpeed", deepspeed_accelerator=spec.type)
    checks = [step.run for step in SETUP if step.name in ("check_deepspeed_support", "check_collectives")]
    assert len(checks) == 2
    refused = contextlib.suppress() if refusal("deepspeed", spec) is None else pytest.raises(ShardingNotSupportedError)
    with refused:
        for check in checks:
            check(target)


@pytest.mark.parametrize("device_type", sorted(DEVICE_TABLE))
def test_sharding_refuses_exactly_where_the_pages_say(device_type: str) -> None:
    """``check_collectives`` (every multi-process family's first step) refuses where ``refusal`` says so."""
    from types import SimpleNamespace

    from lightning_anyaccel.strategies.steps import check_collectives

    spec = DEVICE_TABLE[device_type]
    target = SimpleNamespace(spec=spec, device_type=spec.type, sharding_name="FSDP")
    refused = contextlib.suppress() if refusal("fsdp", spec) is None else pytest.raises(ShardingNotSupportedError)
    with refused:
        check_collectives(target)
