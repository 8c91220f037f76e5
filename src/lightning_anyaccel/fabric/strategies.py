"""Fabric's strategies, under their public names: one device, DDP, or sharded (FSDP, FSDP2, DeepSpeed).

One per row of :data:`~lightning_anyaccel.strategies.families.FAMILIES`. Each is written next to its Trainer twin, in its family's module of
:mod:`lightning_anyaccel.strategies` (``FabricDDPStrategy`` in ``strategies/ddp.py``, ...), and is
published here as ``AnyDDPStrategy``, ... (their ``__module__`` is this module, so pickle finds
them here). What Fabric names differently from the Trainer is in its front-end adapter,
:class:`lightning_anyaccel.front_ends.FabricSide`.

Checkpoints need nothing more: Fabric's default ``TorchCheckpointIO`` loads every tensor onto
CPU (its ``map_location`` keeps the CPU storage torch deserialised) and ``load_state_dict``
copies it to the device, so ``fabric.load`` already reads checkpoints written on devices this
machine does not have (pinned by ``tests/test_simulated.py``).

Example:
    >>> AnyDDPStrategy.__module__, AnyDDPStrategy.__name__
    ('lightning_anyaccel.fabric.strategies', 'AnyDDPStrategy')
"""

from __future__ import annotations

from lightning_anyaccel.strategies.families import fabric_strategies
from lightning_anyaccel.strategies.model_parallel import fully_shard_data_parallel  # noqa: F401  (public: __all__)
from lightning_anyaccel.strategies.process_launchers import (  # noqa: F401  (public: __all__)
    FabricMultiProcessingLauncher as AnyMultiProcessingLauncher,
)

globals().update(fabric_strategies())  # one per row of strategies.families.FAMILIES

__all__ = sorted([*fabric_strategies(), "AnyMultiProcessingLauncher", "fully_shard_data_parallel"])
