"""``AnyModelParallelStrategy``: FSDP2 (``fully_shard``) and tensor parallelism on any device type.

Lightning's ``ModelParallelStrategy`` already builds its device mesh on ``root_device.type``
and works unchanged on CPU (measured: gloo, 2 processes). What it lacks elsewhere is what the
package adds to every strategy: the collective backend from the device table (Lightning's map
gives HPU ``fake``, audit row 10), a mixed-precision plugin for the device type instead of
``"cuda"``, the barrier without NCCL-only ``device_ids``, and the refusal of devices without
collectives. The user shards in ``LightningModule.configure_model`` with ``fully_shard``, using
``self.device_mesh``.

Registered names: ``any_model_parallel`` (Lightning's defaults: tensor parallel within a node) and
``any_fsdp2`` (``tensor_parallel_size=1``: every process in the data-parallel/sharding dimension).

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_fsdp2", devices=2, logger=False)
    >>> type(trainer.strategy).__name__
    'AnyModelParallelStrategy'
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy
from typing_extensions import override

from lightning_anyaccel.checkpoint import AtomicSaveMixin
from lightning_anyaccel.strategies.sharding import AnyModelParallelMixin


class AnyModelParallelStrategy(AtomicSaveMixin, AnyModelParallelMixin, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 + tensor parallel) on the accelerator's device type.

    Takes the arguments of ``ModelParallelStrategy``: ``data_parallel_size``, ``tensor_parallel_size``,
    ``save_distributed_checkpoint`` (``True``: a sharded folder; ``False``: one full file),
    ``process_group_backend`` (default: from the device table) and ``timeout``. The device logic is
    :class:`~lightning_anyaccel.strategies.sharding.AnyModelParallelMixin`, shared with Fabric.
    """

    @override
    def barrier(self, name: str | None = None) -> None:
        self._barrier()


__all__ = ["AnyModelParallelStrategy"]
