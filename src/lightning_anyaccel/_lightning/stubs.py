"""Typing stubs: the hooks of Lightning's classes the package's mixins override, declared once for the type checker.

A mixin of the package (:class:`~lightning_anyaccel.strategies.base.AnyStrategyMixin`, ...) is
mixed in before a Lightning class of either front end (the Trainer's or Fabric's), so it has no
Lightning base of its own. For the type checker only, its base is one of the classes here, which
declare the methods and properties of Lightning's classes that the mixin overrides or calls through
``super()``::

    if TYPE_CHECKING:
        _Base = StrategyHooks
    else:
        _Base = object

At run time the mixins' base stays ``object``. Each class names the Lightning classes it stands
for (:attr:`~LightningHooks.stands_for`, as in ``lightning``; the same names in
``pytorch_lightning`` and ``lightning_fabric``); ``tests/test_lightning_contract.py`` checks that
every hook declared here exists there, with the same parameter names. Where a declaration takes
``*args``/``**kwargs`` (hooks whose parameters differ between the classes it stands for), the
parameters it names exist in each of them.

Example:
    >>> StrategyHooks.stands_for
    ('lightning.pytorch.strategies.Strategy', 'lightning.fabric.strategies.Strategy')
    >>> sorted(hooks_of(TrainerStrategyHooks))
    ['on_exception', 'reduce', 'setup']
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any, ClassVar

from lightning_anyaccel import _lightning


class LightningHooks:
    """Base of the declarations: :attr:`stands_for` names the Lightning classes a subclass declares hooks of."""

    #: The Lightning classes (dotted names in ``lightning``) whose hooks the class declares.
    stands_for: ClassVar[tuple[str, ...]] = ()


class StrategyHooks(LightningHooks):
    """Hooks of the Trainer's and Fabric's ``Strategy`` that every strategy of the package overrides."""

    stands_for: ClassVar[tuple[str, ...]] = ("lightning.pytorch.strategies.Strategy", "lightning.fabric.strategies.Strategy")

    @property
    def checkpoint_io(self) -> Any:
        """The strategy's checkpoint IO (Lightning's ``TorchCheckpointIO`` unless one is given)."""
        ...

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None: ...

    def setup_environment(self) -> None:
        """Set up the process (select the device, start the process group) before anything else."""
        ...

    def _configure_launcher(self) -> None:
        """Set the launcher that starts the processes (or ``None`` for none)."""
        ...

    def barrier(self, name: str | None = None) -> None:
        """Synchronise all processes."""
        ...

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the backward pass of a loss."""
        ...

    def batch_to_device(self, batch: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Move a batch to the device (every batch of the Trainer's loops and of Fabric's dataloaders)."""
        ...

    def process_dataloader(self, dataloader: Any) -> Any:
        """Adapt a dataloader before it is used (every dataloader of the Trainer's loops and of Fabric's setup)."""
        ...

    def teardown(self) -> None:
        """Release what the run held (the Trainer calls it at the end of ``fit``/``validate``/``test``)."""
        ...

    def optimizer_step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Step ``optimizer`` (the Trainer's loop, Fabric's wrapped optimizer's ``step``)."""
        ...


class TrainerStrategyHooks(StrategyHooks):
    """Hooks of the Trainer's ``Strategy`` only (the shared mixins override them; Fabric never calls them)."""

    stands_for: ClassVar[tuple[str, ...]] = ("lightning.pytorch.strategies.Strategy",)

    def setup(self, trainer: Any) -> None:
        """Set up the model, optimizers and precision for ``trainer``."""
        ...

    def on_exception(self, exception: BaseException) -> None:
        """Called when the Trainer's run fails with ``exception``."""
        ...

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Reduce ``tensor`` over the processes of ``group`` (``self.log(..., sync_dist=True)`` calls it)."""
        ...


class FabricStrategyHooks(StrategyHooks):
    """Hooks of Fabric's ``Strategy`` only (the shared mixins override them; the Trainer never calls them)."""

    stands_for: ClassVar[tuple[str, ...]] = ("lightning.fabric.strategies.Strategy",)

    def all_reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Reduce ``tensor`` over the processes of ``group`` (``fabric.all_reduce`` calls it)."""
        ...


class SingleDeviceHooks(TrainerStrategyHooks):
    """Hooks of the Trainer's and Fabric's ``SingleDeviceStrategy`` (its ``__init__``)."""

    stands_for: ClassVar[tuple[str, ...]] = ("lightning.pytorch.strategies.SingleDeviceStrategy", "lightning.fabric.strategies.SingleDeviceStrategy")

    def __init__(self, device: Any = "cpu", **kwargs: Any) -> None:
        """``device``: the device (Lightning's default ``"cpu"``); the other arguments differ by front end."""


class DistributedHooks(TrainerStrategyHooks, FabricStrategyHooks):
    """Hooks of the Trainer's and Fabric's multi-process strategies (DDP, FSDP, ModelParallel, DeepSpeed)."""

    stands_for: ClassVar[tuple[str, ...]] = (
        "lightning.pytorch.strategies.DDPStrategy", "lightning.fabric.strategies.DDPStrategy",
        "lightning.pytorch.strategies.FSDPStrategy", "lightning.fabric.strategies.FSDPStrategy",
        "lightning.pytorch.strategies.ModelParallelStrategy", "lightning.fabric.strategies.ModelParallelStrategy",
        "lightning.pytorch.strategies.DeepSpeedStrategy", "lightning.fabric.strategies.DeepSpeedStrategy",
    )

    def __init__(self, *args: Any, timeout: timedelta | None = None, **kwargs: Any) -> None:
        """``timeout``: how long ranks wait for each other; the other arguments differ by strategy."""

    def _get_process_group_backend(self) -> str:
        """The collective backend the process group is started with."""
        ...


class MultiProcessingLauncherHooks(LightningHooks):
    """Hooks of the Trainer's and Fabric's spawn/fork launcher (``_MultiProcessingLauncher``)."""

    stands_for: ClassVar[tuple[str, ...]] = (_lightning.TRAINER_MULTIPROCESSING_LAUNCHER, _lightning.FABRIC_MULTIPROCESSING_LAUNCHER)

    def launch(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Start the processes, each running ``function``; return rank 0's result."""
        ...

    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> Any:
        """What each started process runs (its other parameters differ between the Trainer and Fabric)."""
        ...


class FSDPPrecisionHooks(LightningHooks):
    """Hooks of the Trainer's and Fabric's ``FSDPPrecision``."""

    stands_for: ClassVar[tuple[str, ...]] = ("lightning.pytorch.plugins.precision.FSDPPrecision", "lightning.fabric.plugins.precision.FSDPPrecision")

    def __init__(self, precision: Any, scaler: Any = None) -> None:
        """``precision``: ``"bf16-mixed"``, ``"16-mixed"``, ...; ``scaler``: a ``ShardedGradScaler`` (16-mixed)."""

    def forward_context(self) -> AbstractContextManager:
        """The context the forward pass runs in (autocast for a mixed precision)."""
        ...


def hooks_of(cls: type[LightningHooks]) -> dict[str, Any]:
    """The hooks ``cls`` itself declares (not those of its bases): name -> function or property."""
    return {
        name: value for name, value in vars(cls).items()
        if not (name.startswith("__") and name != "__init__") and name != "stands_for"
    }


#: Every class of declarations.
ALL_HOOKS: tuple[type[LightningHooks], ...] = (
    StrategyHooks, TrainerStrategyHooks, FabricStrategyHooks, SingleDeviceHooks, DistributedHooks,
    MultiProcessingLauncherHooks, FSDPPrecisionHooks,
)

__all__ = [
    "ALL_HOOKS",
    "DistributedHooks",
    "FSDPPrecisionHooks",
    "FabricStrategyHooks",
    "LightningHooks",
    "MultiProcessingLauncherHooks",
    "SingleDeviceHooks",
    "StrategyHooks",
    "TrainerStrategyHooks",
    "hooks_of",
]
