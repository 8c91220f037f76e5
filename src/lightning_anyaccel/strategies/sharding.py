"""Former home of the sharded strategies' device logic; its names stay importable from here.

Each sharded family has its own module now: :mod:`~lightning_anyaccel.strategies.fsdp`,
:mod:`~lightning_anyaccel.strategies.model_parallel` and :mod:`~lightning_anyaccel.strategies.deepspeed`,
on the common base of :mod:`~lightning_anyaccel.strategies.sharded`.

Example:
    >>> deepspeed_device_types()
    ['cpu', 'cuda', 'hpu', 'npu', 'xpu']
"""

from __future__ import annotations

from lightning_anyaccel.strategies.deepspeed import DEEPSPEED_NAMES, AnyDeepSpeedMixin, deepspeed_device_types
from lightning_anyaccel.strategies.errors import DeepSpeedNotInstalledError, ShardingNotSupportedError
from lightning_anyaccel.strategies.fsdp import AnyFSDPMixin, full_state_dict_context
from lightning_anyaccel.strategies.model_parallel import AnyModelParallelMixin
from lightning_anyaccel.strategies.multi_process import AnyDistributedMixin
from lightning_anyaccel.strategies.sharded import AnyShardedMixin

__all__ = [
    "DEEPSPEED_NAMES",
    "AnyDeepSpeedMixin",
    "AnyDistributedMixin",
    "AnyFSDPMixin",
    "AnyModelParallelMixin",
    "AnyShardedMixin",
    "DeepSpeedNotInstalledError",
    "ShardingNotSupportedError",
    "deepspeed_device_types",
    "full_state_dict_context",
]
