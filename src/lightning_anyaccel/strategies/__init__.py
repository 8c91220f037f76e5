"""Strategies for the Trainer and Fabric: one device, DDP, or sharded (FSDP, FSDP2, DeepSpeed) on any device type.

One module per strategy family (``single``, ``ddp``, ``fsdp``, ``model_parallel``, ``deepspeed``),
each with its setup steps (``SETUP``) and both its Trainer class and its Fabric class, and one row
per family in :data:`~lightning_anyaccel.strategies.families.FAMILIES`: the Trainer classes are
published here from that table (``AnyDDPStrategy``, ...), the Fabric classes by
:mod:`lightning_anyaccel.fabric`. The layer may import the device, cluster and checkpoint layers,
the front-end adapter and the contract, never the public faces above it.
"""

from lightning_anyaccel.strategies.errors import (  # noqa: F401  (public: __all__ below)
    DeepSpeedNotInstalledError,
    ShardingNotSupportedError,
)
from lightning_anyaccel.strategies.families import trainer_strategies

globals().update(trainer_strategies())

__all__ = sorted([*trainer_strategies(), "DeepSpeedNotInstalledError", "ShardingNotSupportedError"])
