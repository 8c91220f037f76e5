"""Strategies for the Trainer: one device, DDP, or sharded (FSDP, FSDP2, DeepSpeed) on any device type."""

from lightning_anyaccel.strategies.ddp import AnyDDPStrategy
from lightning_anyaccel.strategies.deepspeed import AnyDeepSpeedStrategy, DeepSpeedNotInstalledError
from lightning_anyaccel.strategies.fsdp import AnyFSDPStrategy
from lightning_anyaccel.strategies.model_parallel import AnyModelParallelStrategy
from lightning_anyaccel.strategies.sharding import ShardingNotSupportedError
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
