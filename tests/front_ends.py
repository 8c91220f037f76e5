"""Lightning's two front ends, Trainer and Fabric, as one object a test is parameterised with.

A behaviour that both front ends have is tested by one function: ``@pytest.mark.parametrize(
"front_end", FRONT_ENDS)`` (ids ``trainer`` and ``fabric``) runs it once per front end, and the
function builds and reads the front end only through :class:`FrontEnd`::

    @pytest.mark.parametrize("front_end", FRONT_ENDS)
    def test_ddp_backend(front_end):
        strategy = front_end.build(accelerator="xpu", strategy="any_ddp", devices=2).strategy
        assert isinstance(strategy, front_end.package.AnyDDPStrategy)

``front_end.package`` is the package's module for that front end (``lightning_anyaccel`` or
``lightning_anyaccel.fabric``): its ``AnyAccelerator``, ``AnyDDPStrategy``, ... are the classes a
user of that front end imports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest
from lightning import Fabric, Trainer
from lightning.fabric.plugins.precision import MixedPrecision as FabricMixedPrecision
from lightning.pytorch.plugins.precision import MixedPrecision as TrainerMixedPrecision

import lightning_anyaccel
import lightning_anyaccel.fabric

#: What every Trainer of these tests leaves out: nothing is written, nothing printed.
QUIET_TRAINER = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


@dataclass(frozen=True)
class FrontEnd:
    """How a test builds one front end and reads what Lightning made of its flags.

    Attributes:
        name: ``"trainer"`` or ``"fabric"`` (the test id).
        package: the package's module for this front end (its strategy and accelerator classes).
        mixed_precision: Lightning's ``MixedPrecision`` plugin class of this front end.
    """

    name: str
    package: ModuleType
    mixed_precision: type
    _build: Callable[..., Any]
    _precision: Callable[[Any], Any]
    _strategy_precision: Callable[[Any], Any]
    _launch: Callable[[Any, Callable[[], Any]], Any]
    _start: Callable[[Any], None]

    def build(self, **flags: Any) -> Any:
        """``Trainer(**flags)`` (with nothing logged or saved) or ``Fabric(**flags)``."""
        return self._build(**flags)

    def precision(self, built: Any) -> Any:
        """The precision plugin the front end trains with."""
        return self._precision(built)

    def strategy_precision(self, built: Any) -> Any:
        """The precision plugin the strategy holds (the front end must train with this one)."""
        return self._strategy_precision(built)

    def launch(self, built: Any, function: Callable[[], Any]) -> Any:
        """Start the processes through the strategy's launcher, running ``function`` in each."""
        return self._launch(built, function)

    def start(self, built: Any) -> None:
        """What the front end checks on the device before the first step (device set, precision probed)."""
        self._start(built)

    def __repr__(self) -> str:
        return self.name


def _trainer_start(trainer: Trainer) -> None:
    trainer.strategy.accelerator.setup_device(trainer.strategy.root_device)
    trainer.strategy.accelerator.setup(trainer)


TRAINER = FrontEnd(
    name="trainer",
    package=lightning_anyaccel,
    mixed_precision=TrainerMixedPrecision,
    _build=lambda **flags: Trainer(**{**QUIET_TRAINER, **flags}),
    _precision=lambda trainer: trainer.precision_plugin,
    _strategy_precision=lambda trainer: trainer.strategy.precision_plugin,
    _launch=lambda trainer, function: trainer.strategy.launcher.launch(function),
    _start=_trainer_start,
)

FABRIC = FrontEnd(
    name="fabric",
    package=lightning_anyaccel.fabric,
    mixed_precision=FabricMixedPrecision,
    _build=lambda **flags: Fabric(**flags),
    _precision=lambda fabric: fabric._precision,  # what Fabric's autocast and backward use
    _strategy_precision=lambda fabric: fabric.strategy.precision,
    _launch=lambda fabric, function: fabric.launch(lambda _: function()),
    _start=lambda fabric: fabric.launch(),
)

#: ``@pytest.mark.parametrize("front_end", FRONT_ENDS)``: one test per front end, ids ``trainer``/``fabric``.
FRONT_ENDS = [pytest.param(TRAINER, id="trainer"), pytest.param(FABRIC, id="fabric")]
