"""Strategies for the Trainer and Fabric: one device, DDP, or sharded (FSDP, FSDP2, DeepSpeed) on any device type.

One module per strategy family (``single``, ``ddp``, ``fsdp``, ``model_parallel``, ``deepspeed``),
each with its setup steps (``SETUP``) and both its Trainer class (exported here) and its Fabric
class (exported by :mod:`lightning_anyaccel.fabric`).
"""

from lightning_anyaccel.strategies.ddp import AnyDDPStrategy
from lightning_anyaccel.strategies.deepspeed import AnyDeepSpeedStrategy
from lightning_anyaccel.strategies.errors import DeepSpeedNotInstalledError, ShardingNotSupportedError
from lightning_anyaccel.strategies.fsdp import AnyFSDPStrategy
from lightning_anyaccel.strategies.model_parallel import AnyModelParallelStrategy
from lightning_anyaccel.strategies.single import AnySingleDeviceStrategy

__all__ = [
    "AnyDDPStrategy",
    "AnyDeepSpeedStrategy",
    "AnyFSDPStrategy",
    "AnyModelParallelStrategy",
    "AnySingleDeviceStrategy",
    "DeepSpeedNotInstalledError",
    "ShardingNotSupportedError",
]
