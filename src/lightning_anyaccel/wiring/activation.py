"""Programs you don't edit: ``LIGHTNING_ANYACCEL_ACTIVATE=1`` puts the package to work for them.

A LightningCLI application, a library's training command or a colleague's script builds its
Trainer or Fabric itself. With ``LIGHTNING_ANYACCEL_ACTIVATE=1`` in the environment, the start-up
hook the package installs (``lightning_anyaccel_startup.pth``, :mod:`_lightning_anyaccel_startup`)
imports the package as soon as the program imports Lightning, in every Python process that
inherits the variable: ``python``, ``python -m``, console scripts, ``torchrun``, ``mpirun``,
``srun`` and the processes Lightning's launchers start. Then, in that program:

- ``accelerator="auto"`` (the default) takes the device torch reports (:mod:`lightning_anyaccel.wiring.auto`);
- the package's names work in configuration (``--trainer.accelerator xpu``,
  ``--trainer.strategy any_ddp``, YAML) and its classes by class path;
- Lightning's strategy objects the program builds itself (``FSDPStrategy(...)``,
  ``DDPStrategy(...)``) train on the device as the package's strategies with the same arguments
  (:func:`lightning_anyaccel.wiring.policy.translate`), where they would otherwise be refused. For that,
  :func:`record_strategy_arguments` keeps the arguments of Lightning's strategy classes.

Example:
    >>> is_active({"LIGHTNING_ANYACCEL_ACTIVATE": "1"}), is_active({})
    (True, False)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from _lightning_anyaccel_import_hook import ACTIVATE_ENV, ACTIVATE_VALUES, activation_requested
from lightning_anyaccel import _lightning
from lightning_anyaccel.strategies.families import PROGRAM_STRATEGIES


def is_active(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the package is put to work for the running program (``LIGHTNING_ANYACCEL_ACTIVATE=1``).

    Raises:
        ValueError: a value other than ``"1"``/``"0"``, naming the accepted ones.
    """
    return activation_requested(environ)


def record_strategy_arguments(distribution: _lightning.Distribution, side: str) -> None:
    """Keep the arguments of Lightning's strategy objects of ``distribution``'s ``side`` (``"trainer"``/``"fabric"``).

    Done at registration, only while :func:`is_active`: the program builds its strategies after
    Lightning was imported, and the start-up hook imports the package right after Lightning.
    """
    strategies = distribution.module("lightning.pytorch.strategies" if side == "trainer" else "lightning.fabric.strategies")
    for name in PROGRAM_STRATEGIES:
        _lightning.record_constructor_arguments(getattr(strategies, name), when=is_active)


__all__ = ["ACTIVATE_ENV", "ACTIVATE_VALUES", "PROGRAM_STRATEGIES", "is_active", "record_strategy_arguments"]
