"""Users' code as they already write it, on both Lightning packages (in-process; see ``wiring/policy.py``).

The vendor plugins' first example is ``Trainer(accelerator="hpu", devices=8)`` with no strategy;
projects use ``import pytorch_lightning as pl``; scripts pass ``strategy="ddp"`` or
``"deepspeed_stage_2"`` by name. Every test runs on ``lightning`` and on ``pytorch_lightning``
(with ``lightning_fabric``), through ``EVERY_FRONT_END``/``EVERY_TRAINER`` of ``tests/front_ends.py``;
simulated devices (``tests/fakes.py``) stand in for hardware where
the choice of strategy, devices and backend is what is checked. Real training with these forms
runs in ``tests/test_journeys.py``.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import lightning_anyaccel  # noqa: F401  (registers the names)
from fakes import install_fake_device
from front_ends import EVERY_FRONT_END, EVERY_TRAINER, FABRIC, TRAINER, FrontEndCase
from lightning_anyaccel import ShardingNotSupportedError
from lightning_anyaccel.wiring.policy import FrontEndMismatchError, StrategyNotSupportedError

# ----- the accelerator alone ------------------------------------------------------------------------


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize(("device_type", "backend"), [("hpu", "hccl"), ("xpu", "xccl")])
def test_accelerator_alone_on_eight_devices_is_ddp(monkeypatch, front_end: FrontEndCase, device_type, backend) -> None:
    """The vendor READMEs' first line: ``Trainer(accelerator="hpu", devices=8)``, by name and by instance."""
    install_fake_device(monkeypatch, device_type, count=8, backend=backend)
    for accelerator in (device_type, front_end.package.AnyAccelerator(device_type)):
        strategy = front_end.build(accelerator=accelerator, devices=8).strategy
        assert isinstance(strategy, front_end.package.AnyDDPStrategy), type(strategy).__mro__
        assert strategy._start_method == "popen"
        per_rank = [0] * 8 if device_type == "hpu" else range(8)  # Gaudi: every process sees its own card as hpu:0
        assert strategy.parallel_devices == [torch.device(device_type, i) for i in per_rank]
        assert strategy._get_process_group_backend() == strategy.process_group_backend == backend


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_accelerator_alone_on_one_device_trains_there(monkeypatch, front_end: FrontEndCase) -> None:
    """One device: the device the user selected, with mixed precision on its type (Lightning: CPU, CUDA autocast)."""
    install_fake_device(monkeypatch, "xpu", count=2)
    trainer_or_fabric = front_end.build(accelerator="xpu", devices=[1], precision="bf16-mixed")
    strategy = trainer_or_fabric.strategy
    assert isinstance(strategy, front_end.package.AnySingleDeviceStrategy)
    assert strategy.root_device == torch.device("xpu", 1)
    precision = front_end.precision(trainer_or_fabric)
    assert precision.device == "xpu"


@pytest.mark.parametrize("front_end", EVERY_TRAINER)
def test_hpu_by_name_is_no_longer_refused(monkeypatch, front_end: FrontEndCase) -> None:
    """Lightning 2.6 answers ``accelerator="hpu"`` with "HPU is currently not supported" for auto strategies."""
    install_fake_device(monkeypatch, "hpu", count=1, backend="hccl")
    strategy = front_end.build(accelerator="hpu", devices=1).strategy
    assert strategy.root_device == torch.device("hpu", 0)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_accelerator_alone_in_a_notebook_forks(monkeypatch, front_end: FrontEndCase) -> None:
    from lightning.fabric.utilities import imports

    monkeypatch.setattr(imports, "_IS_INTERACTIVE", True)
    strategy = front_end.build(accelerator="any", devices=2).strategy
    assert isinstance(strategy, front_end.package.AnyDDPStrategy) and strategy._start_method == "fork"


# ----- Lightning's strategy names ---------------------------------------------------------------------

NAMES = [
    ("ddp", "AnyDDPStrategy", {"_start_method": "popen"}),
    ("ddp_spawn", "AnyDDPStrategy", {"_start_method": "spawn"}),
    ("ddp_notebook", "AnyDDPStrategy", {"_start_method": "fork"}),
    ("fsdp", "AnyFSDPStrategy", {}),
    ("deepspeed_stage_2", "AnyDeepSpeedStrategy", {}),
]


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
@pytest.mark.parametrize(("name", "cls", "attributes"), NAMES, ids=[n[0] for n in NAMES])
def test_lightning_names_select_the_packages_strategy(front_end: FrontEndCase, name, cls, attributes) -> None:
    strategy = front_end.build(accelerator="any", strategy=name, devices=2).strategy
    assert isinstance(strategy, getattr(front_end.package, cls))
    for attribute, value in attributes.items():
        assert getattr(strategy, attribute) == value
    if name.startswith("deepspeed"):
        assert strategy.config["zero_optimization"]["stage"] == 2


@pytest.mark.parametrize("front_end", EVERY_TRAINER)
def test_find_unused_parameters_names(front_end: FrontEndCase) -> None:
    strategy = front_end.build(accelerator="any", strategy="ddp_find_unused_parameters_true",
                               devices=2).strategy
    assert isinstance(strategy, front_end.package.AnyDDPStrategy)
    assert strategy._ddp_kwargs["find_unused_parameters"] is True


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_lightning_strategy_instances_are_refused_on_vendor_devices(monkeypatch, front_end: FrontEndCase) -> None:
    install_fake_device(monkeypatch, "hpu", count=2, backend="hccl")
    strategies = front_end.lightning.strategies
    for lightning_strategy, suggestion in ((strategies.DDPStrategy(), "any_ddp"),
                                           (strategies.FSDPStrategy(), "any_fsdp")):
        with pytest.raises(StrategyNotSupportedError, match=f"Lightning's .* can not train on Intel Gaudi .*strategy='{suggestion}'"):
            front_end.build(accelerator="hpu", strategy=lightning_strategy, devices=2)


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_builtin_accelerators_see_no_change(front_end: FrontEndCase) -> None:
    """Lightning's own accelerator names keep Lightning's own strategy choices."""
    assert type(front_end.build(accelerator="cpu", devices=2).strategy).__name__ == "DDPStrategy"
    assert type(front_end.build(accelerator="cpu", strategy="ddp", devices=2).strategy).__name__ == "DDPStrategy"
    assert type(front_end.build(accelerator="cpu", devices=1).strategy).__name__ == "SingleDeviceStrategy"


# ----- both packages, and not mixed ---------------------------------------------------------------------


def _registered(front_end: FrontEndCase) -> list[str]:
    strategies = front_end.lightning.strategies
    registry = strategies.StrategyRegistry if front_end.side == "trainer" else strategies.STRATEGY_REGISTRY
    return sorted(name for name in registry if name.startswith("any_"))


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_every_registered_name_builds_on_its_front_end(front_end: FrontEndCase) -> None:
    names = _registered(front_end)
    assert {"any_single", "any_ddp", "any_ddp_spawn", "any_fsdp", "any_fsdp2", "any_deepspeed_stage_3"} <= set(names)
    assert _registered(TRAINER if front_end.side == "trainer" else FABRIC) == names  # the same names on both packages
    base = front_end.lightning.__name__.split(".")[0]
    for name in names:
        if front_end.side == "fabric" and name == "any_model_parallel":  # Fabric can't guess a tensor-parallel plan
            with pytest.raises(ValueError, match="needs your parallelize_fn"):
                front_end.build(accelerator="any", strategy=name, devices=2)
            continue
        if name == "any_fsdp_cpu_offload":  # on CPU nothing to offload to: refused, naming the name that works
            with pytest.raises(ShardingNotSupportedError, match="Use strategy='any_fsdp' on CPU"):
                front_end.build(accelerator="any", strategy=name, devices=2)
            continue
        strategy = front_end.build(accelerator="any", strategy=name, devices=1 if name == "any_single" else 2).strategy
        lightning_bases = [c.__module__ for c in type(strategy).__mro__ if c.__name__.endswith("Strategy")
                           and not c.__module__.startswith("lightning_anyaccel")]
        assert lightning_bases and all(m.startswith(base) for m in lightning_bases), (name, lightning_bases)


@pytest.mark.parametrize("front_end", EVERY_TRAINER)
def test_package_classes_pickle_on_their_front_end(front_end: FrontEndCase) -> None:
    """``spawn`` pickles the strategy and its launcher: ported classes must be found again by name."""
    module = front_end.package
    strategy = front_end.build(accelerator="any", strategy="any_ddp_spawn", devices=2).strategy
    for obj in (module.AnyAccelerator("cpu"), strategy.launcher, module.AnyFSDPStrategy):
        clone = pickle.loads(pickle.dumps(obj))
        assert (clone if isinstance(clone, type) else type(clone)).__module__ == (
            obj if isinstance(obj, type) else type(obj)).__module__
    assert pickle.loads(pickle.dumps(module.AnyAccelerator("cpu"))).device_type == "cpu"


def test_mixing_the_two_packages_fails_fast() -> None:
    import lightning
    import pytorch_lightning as pl

    import lightning_anyaccel.pytorch_lightning as for_pl

    with pytest.raises(FrontEndMismatchError, match="built for `lightning`.*Import it from `lightning_anyaccel.pytorch_lightning`"):
        pl.Trainer(accelerator=lightning_anyaccel.AnyAccelerator("cpu"), devices=1)
    with pytest.raises(FrontEndMismatchError, match="built for `pytorch_lightning`.*Import it from `lightning_anyaccel`"):
        lightning.Trainer(accelerator="any", strategy=for_pl.AnyDDPStrategy(), devices=2)
    with pytest.raises(FrontEndMismatchError, match="built for `pytorch_lightning`"):
        lightning.Fabric(accelerator=for_pl.AnyAccelerator("cpu"), devices=1)


def test_verify_fit_runs_with_pytorch_lightning() -> None:
    """``verify --frontend pytorch_lightning``'s fit, in-process (the other checks do not use Lightning)."""
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.kit import verify

    assert verify.check_fit(get_spec("cpu"), "pytorch_lightning").startswith("4 steps on cpu")
    assert verify.main(["--frontend", "pytorch_lightning", "--device", "not-a-device"]) == 1  # its report, failed
