"""What every strategy of the package is, for the Trainer and for Fabric: :class:`AnyStrategyMixin`.

The mixin goes first in a strategy's bases, before the Lightning strategy class it extends
(either front end). It runs the strategy family's setup (``SETUP``, an ordered tuple of
:mod:`~lightning_anyaccel.strategies.steps`) in ``setup_environment``, and gives the strategy
the front-end adapter (:attr:`AnyStrategyMixin.side`), the device type, the atomic checkpoint
IO. The names it registers are its family's row in :mod:`~lightning_anyaccel.strategies.families`.

Example:
    >>> from lightning_anyaccel.strategies import AnyDDPStrategy as TrainerDDP
    >>> from lightning_anyaccel.fabric import AnyDDPStrategy as FabricDDP
    >>> issubclass(TrainerDDP, AnyStrategyMixin) and issubclass(FabricDDP, AnyStrategyMixin)
    True
    >>> TrainerDDP().side.name, FabricDDP().side.name
    ('trainer', 'fabric')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeVar

import torch
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning.stubs import FabricStrategyHooks, TrainerStrategyHooks
from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.cluster import fork_deadlock, watchdog
from lightning_anyaccel.device.compilation import check_compiled
from lightning_anyaccel.front_ends import FrontEnd, TrainerSide
from lightning_anyaccel.strategies.steps import Setup, run_setup

if TYPE_CHECKING:
    _Base = TrainerStrategyHooks
    _FabricBase = FabricStrategyHooks
else:
    _Base = _FabricBase = object

T = TypeVar("T", bound=type)

#: Where Fabric's strategy classes are published (and found again by pickle): their public module.
FABRIC_PUBLIC_MODULE = "lightning_anyaccel.fabric.strategies"


class Registered(NamedTuple):
    """A name a strategy family registers with each front end: its description, the arguments it stands for and
    Lightning's registered names it replaces (``strategy="ddp"`` trains as ``"any_ddp"``).

    ``lightning``: those names; ``None`` (default) for the one Lightning name that is the registered name without
    ``any_`` (``any_fsdp`` replaces ``fsdp``), ``()`` for none.
    """

    description: str
    arguments: dict[str, Any]
    lightning: tuple[str, ...] | None = None

    def replaces(self, name: str) -> tuple[str, ...]:
        """Lightning's names that registered name ``name`` (this entry's) replaces."""
        return self.lightning if self.lightning is not None else (name.removeprefix("any_"),)


def fabric_class(name: str) -> Callable[[T], T]:
    """Publish a Fabric class as ``name`` of :data:`FABRIC_PUBLIC_MODULE`, where users and pickle find it.

    Each Fabric class is written next to its Trainer twin, in its family's module (as
    ``FabricDDPStrategy`` beside ``AnyDDPStrategy``); its public name
    (``lightning_anyaccel.fabric.strategies.AnyDDPStrategy``) stays what it always was.
    """

    def publish(cls: T) -> T:
        cls.__module__ = FABRIC_PUBLIC_MODULE
        cls.__name__ = cls.__qualname__ = name
        return cls

    return publish


class AnyStrategyMixin(_Base):
    """Device-generic behaviour of every strategy; mixed in before a Lightning strategy class.

    Relies on the Lightning strategy API only: ``root_device``, ``accelerator``, the precision
    plugin (through :attr:`side`) and ``checkpoint_io``.
    """

    root_device: torch.device
    accelerator: Any
    #: The name the strategy registers under.
    strategy_name: ClassVar[str] = ""
    #: The Lightning package the class is built on (:func:`lightning_anyaccel._lightning.port` sets it).
    _distribution: ClassVar[_lightning.Distribution] = _lightning.LIGHTNING
    #: The front end the class serves (Trainer or Fabric): how it names what differs between them.
    _side: ClassVar[type[FrontEnd]] = TrainerSide
    #: The strategy's setup, in order (the family module's ``SETUP``).
    setup_steps: ClassVar[Setup] = ()

    @property
    def side(self) -> FrontEnd:
        """The front-end adapter of this strategy (Trainer or Fabric, on its Lightning package)."""
        return self._side(self._distribution)

    @override
    def setup_environment(self) -> None:
        """Run every step of :attr:`setup_steps`, in order (in the worker)."""
        run_setup(self, self.setup_steps, launching=False)

    def _validate_device_setup(self) -> None:
        """Run the steps of :attr:`setup_steps` that the launching process runs, before any worker starts."""
        run_setup(self, self.setup_steps, launching=True)

    def lightning_setup_environment(self) -> None:
        """Lightning's own ``setup_environment`` (run by the step :func:`~.steps.lightning_setup`)."""
        super().setup_environment()

    @override
    def setup(self, trainer: Any) -> None:
        """The Trainer's model setup, after refusing compiled parts the device cannot compile (Trainer only).

        Runs after ``configure_model``, so a ``torch.compile`` there is checked too
        (:func:`lightning_anyaccel.device.compilation.check_compiled`; nothing is probed where Inductor
        compiles for the device).
        """
        module = getattr(self, "lightning_module", None)
        if module is not None:
            check_compiled(module, self.root_device)
        super().setup(trainer)

    @override
    def backward(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's backward, counted as progress for the stall watchdog (:mod:`~lightning_anyaccel.cluster.watchdog`)."""
        watchdog.progress()
        return super().backward(*args, **kwargs)

    @override
    def batch_to_device(self, batch: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Lightning's move of a batch (every batch of every loop), counted as progress for the stall watchdog."""
        watchdog.progress()
        return super().batch_to_device(batch, device, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's optimizer step, counted as progress for the stall watchdog (Fabric's ``optimizer.step()``)."""
        watchdog.progress()
        return super().optimizer_step(optimizer, *args, **kwargs)

    @override
    def process_dataloader(self, dataloader: Any) -> Any:
        """Lightning's hook, after moving forked workers to ``forkserver`` where this Python can deadlock them
        (CPython gh-112275), or warning once where they can not move (:func:`~lightning_anyaccel.cluster.fork_deadlock.avoid_fork`)."""
        fork_deadlock.avoid_fork(dataloader)
        return super().process_dataloader(dataloader)

    @property
    def device_type(self) -> str:
        """The device type this strategy trains on (``self.root_device.type``)."""
        return self.root_device.type

    @property  # type: ignore[explicit-override]  # is @override: mypy 2.4 misses it on a property with a setter
    @override
    def checkpoint_io(self) -> Any:
        """Lightning's checkpoint IO, defaulting to :class:`AtomicCheckpointIO` (a kill mid-save keeps the old file).

        Set lazily rather than in ``__init__``, so ``plugins=[MyCheckpointIO()]`` still works.
        """
        if _lightning.checkpoint_io_given(self) is None:
            _lightning.set_checkpoint_io(self, self.side.port(AtomicCheckpointIO)())
        return super().checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io: Any) -> None:
        _lightning.set_checkpoint_io(self, io)


class FabricProgressMixin(_FabricBase):
    """Fabric: every forward of a module set up by the strategy counts as progress for the stall watchdog.

    A Fabric loop that only evaluates runs no backward and no optimizer step; its forwards are what
    show it alive. Fabric's module wrapper asks the strategy for its precision plugin at every forward
    (and its backward and clipping at theirs), so reading :attr:`precision` counts
    (:func:`~lightning_anyaccel.cluster.watchdog.forward_progress`, one increment): nothing is added
    to the user's module, which pickles as it was. Mixed in first, before the rest of a Fabric
    strategy's bases.
    """

    @property
    @override
    def precision(self) -> Any:
        watchdog.forward_progress()
        return super().precision  # type: ignore[misc]  # Lightning's Fabric Strategy has it

    @precision.setter
    def precision(self, precision: Any) -> None:
        # the next class's setter in the MRO (FSDP's and ModelParallel's check the plugin's type)
        mro = type(self).__mro__
        for klass in mro[mro.index(FabricProgressMixin) + 1:]:
            prop = vars(klass).get("precision")
            if isinstance(prop, property) and prop.fset is not None:
                prop.fset(self, precision)
                return
        raise AttributeError("precision")


__all__ = ["FABRIC_PUBLIC_MODULE", "AnyStrategyMixin", "FabricProgressMixin", "Registered", "fabric_class"]
