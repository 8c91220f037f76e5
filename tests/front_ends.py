"""Lightning's two front ends, Trainer and Fabric, on its two packages, as one object a test is parameterised with.

A behaviour that both front ends have is tested by one function: ``@pytest.mark.parametrize(
"front_end", FRONT_ENDS)`` (ids ``trainer`` and ``fabric``) runs it once per front end, and the
function builds and reads the front end only through :class:`FrontEndCase`::

    @pytest.mark.parametrize("front_end", FRONT_ENDS)
    def test_ddp_backend(front_end):
        strategy = front_end.build(accelerator="xpu", strategy="any_ddp", devices=2).strategy
        assert isinstance(strategy, front_end.package.AnyDDPStrategy)

``front_end.package`` is the package's module for that front end (``lightning_anyaccel`` or
``lightning_anyaccel.fabric``): its ``AnyAccelerator``, ``AnyDDPStrategy``, ... are the classes a
user of that front end imports. ``front_end.lightning`` is Lightning's own module of it
(``lightning.pytorch``, ``lightning.fabric``).

Lightning is published twice, as ``lightning`` and as ``pytorch_lightning`` with
``lightning_fabric``; the package builds its classes on each (``src/lightning_anyaccel/_lightning``).
``EVERY_FRONT_END`` adds the second package's two front ends (ids ``pl-trainer`` and ``pl-fabric``,
packages ``lightning_anyaccel.pytorch_lightning`` and ``lightning_anyaccel.lightning_fabric``): a
behaviour that depends on which package the user imports is tested with it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

#: What every Trainer of these tests leaves out: nothing is written, nothing printed.
QUIET_TRAINER = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@dataclass(frozen=True)
class FrontEndCase:
    """How a test builds one front end and reads what Lightning made of its flags.

    Attributes:
        name: ``"trainer"`` or ``"fabric"``, ``"pl-trainer"`` or ``"pl-fabric"`` (the test id).
        side: ``"trainer"`` or ``"fabric"``.
        package: the package's module for this front end (its strategy and accelerator classes).
        lightning: Lightning's module of this front end (``lightning.pytorch``, ``pytorch_lightning``,
            ``lightning.fabric`` or ``lightning_fabric``): its ``strategies``, ``plugins``, ...
        mixed_precision: Lightning's ``MixedPrecision`` plugin class of this front end.
    """

    name: str
    side: str
    package: ModuleType
    lightning: ModuleType
    mixed_precision: type
    _build: Callable[..., Any]
    _precision: Callable[[Any], Any]
    _strategy_precision: Callable[[Any], Any]
    _launch: Callable[[Any, Callable[[], Any]], Any]
    _all_reduce: Callable[[Any, Any, str], Any]
    _start: Callable[[Any], None]

    def build(self, **flags: Any) -> Any:
        """``Trainer(**flags)`` (with nothing logged or saved) or ``Fabric(**flags)``."""
        return self._build(self.lightning, **flags)

    def precision(self, built: Any) -> Any:
        """The precision plugin the front end trains with."""
        return self._precision(built)

    def strategy_precision(self, built: Any) -> Any:
        """The precision plugin the strategy holds (the front end must train with this one)."""
        return self._strategy_precision(built)

    def launch(self, built: Any, function: Callable[[], Any]) -> Any:
        """Start the processes through the strategy's launcher, running ``function`` in each."""
        return self._launch(built, function)

    def all_reduce(self, built: Any, tensor: Any, op: str) -> Any:
        """``op`` (``"sum"``, ``"mean"``) over every process, as a user of the front end asks for it."""
        return self._all_reduce(built, tensor, op)

    def start(self, built: Any) -> None:
        """What the front end checks on the device before the first step (device set, precision probed)."""
        self._start(built)

    def __repr__(self) -> str:
        return self.name


def _trainer_start(trainer: Any) -> None:
    trainer.strategy.accelerator.setup_device(trainer.strategy.root_device)
    trainer.strategy.accelerator.setup(trainer)


#: What differs between the two sides, Trainer and Fabric, beyond the module they come from.
_SIDES: dict[str, dict[str, Any]] = {
    "trainer": dict(
        _build=lambda root, **flags: root.Trainer(**{**QUIET_TRAINER, **flags}),
        _precision=lambda trainer: trainer.precision_plugin,
        _strategy_precision=lambda trainer: trainer.strategy.precision_plugin,
        _launch=lambda trainer, function: trainer.strategy.launcher.launch(function),
        _all_reduce=lambda trainer, tensor, op: trainer.strategy.reduce(tensor, reduce_op=op),
        _start=_trainer_start,
    ),
    "fabric": dict(
        _build=lambda root, **flags: root.Fabric(**flags),
        _precision=lambda fabric: fabric._precision,  # what Fabric's autocast and backward use
        _strategy_precision=lambda fabric: fabric.strategy.precision,
        _launch=lambda fabric, function: fabric.launch(lambda _: function()),
        _all_reduce=lambda fabric, tensor, op: fabric.all_reduce(tensor, reduce_op=op),
        _start=lambda fabric: fabric.launch(),
    ),
}


def front_end(name: str, side: str, lightning: str, package: str) -> FrontEndCase:
    """The ``side`` (``"trainer"``/``"fabric"``) of Lightning's module ``lightning``, with the package's ``package``.

    Example: ``front_end("pl-trainer", "trainer", "pytorch_lightning", "lightning_anyaccel.pytorch_lightning")``.
    """
    return FrontEndCase(name=name, side=side, package=importlib.import_module(package),
                    lightning=importlib.import_module(lightning),
                    mixed_precision=importlib.import_module(f"{lightning}.plugins.precision").MixedPrecision,
                    **_SIDES[side])


TRAINER = front_end("trainer", "trainer", "lightning.pytorch", "lightning_anyaccel")
FABRIC = front_end("fabric", "fabric", "lightning.fabric", "lightning_anyaccel.fabric")

#: ``@pytest.mark.parametrize("front_end", FRONT_ENDS)``: one test per front end, ids ``trainer``/``fabric``.
FRONT_ENDS = [pytest.param(TRAINER, id="trainer"), pytest.param(FABRIC, id="fabric")]


def _second_package() -> list[Any]:
    """The front ends of ``pytorch_lightning``/``lightning_fabric``, skipped where they are not installed."""
    try:
        front_ends = [front_end("pl-trainer", "trainer", "pytorch_lightning", "lightning_anyaccel.pytorch_lightning"),
                      front_end("pl-fabric", "fabric", "lightning_fabric", "lightning_anyaccel.lightning_fabric")]
    except ImportError as missing:
        reason = f"pytorch_lightning/lightning_fabric not installed ({missing})"
        return [pytest.param(None, id=name, marks=pytest.mark.skip(reason=reason)) for name in ("pl-trainer", "pl-fabric")]
    return [pytest.param(each, id=each.name) for each in front_ends]


#: Both front ends on both Lightning packages: ids ``trainer``, ``fabric``, ``pl-trainer``, ``pl-fabric``.
EVERY_FRONT_END = [*FRONT_ENDS, *_second_package()]
#: The Trainer on both Lightning packages: ids ``trainer`` and ``pl-trainer``.
EVERY_TRAINER = [param for param in EVERY_FRONT_END if param.id.endswith("trainer")]
