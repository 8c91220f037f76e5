"""The model-parallel family: FSDP2 (``fully_shard``) and tensor parallelism on any device type, Trainer and Fabric.

Lightning's ``ModelParallelStrategy`` already builds its device mesh on ``root_device.type``
and works unchanged on CPU (measured: gloo, 2 processes). What it lacks elsewhere is what the
package adds to every strategy: the collective backend from the device table (Lightning's map
gives HPU ``fake``), a mixed-precision plugin for the device type instead of
``"cuda"``, the barrier without NCCL-only ``device_ids``, and the refusal of devices without
collectives. The user shards in ``LightningModule.configure_model`` with ``fully_shard``, using
``self.device_mesh`` (Fabric: a ``parallelize_fn``, by default :func:`fully_shard_data_parallel`).
FSDP2 then reduces gradients with a sum and its own division, never ``ReduceOp.AVG``, which some
vendors' collective libraries refuse (:func:`reduce_gradients_with_sum`).

Registered names: ``any_model_parallel`` (Lightning's defaults: tensor parallel within a node) and
``any_fsdp2`` (``tensor_parallel_size=1``: every process in the data-parallel/sharding dimension).
The Trainer's class is :class:`AnyModelParallelStrategy`, Fabric's
``lightning_anyaccel.fabric.AnyModelParallelStrategy`` (:class:`FabricModelParallelStrategy` here).

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_fsdp2", devices=2, logger=False)
    >>> type(trainer.strategy).__name__
    'AnyModelParallelStrategy'
    >>> [step.name for step in FABRIC_SETUP if step not in SETUP]
    ['check_parallelize_fn']
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, cast

from lightning.fabric.strategies import ModelParallelStrategy as FabricModelParallel
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.nn import Module
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.front_ends import FabricSide
from lightning_anyaccel.strategies.atomic_save import AtomicSaveMixin, FabricAtomicSaveMixin
from lightning_anyaccel.strategies.base import FabricProgressMixin, Registered, fabric_class
from lightning_anyaccel.strategies.errors import ShardingNotSupportedError
from lightning_anyaccel.strategies.sharded import AnyShardedMixin
from lightning_anyaccel.strategies.steps import (
    AFTER_JOIN,
    BEFORE_JOIN,
    DistributedTarget,
    Setup,
    before_launch,
    check_collectives,
    in_worker,
    launch_checks,
    lightning_setup_within_deadline,
    with_launch_check,
)

# ----- the family's own steps ---------------------------------------------------------------------


class FabricModelParallelTarget(DistributedTarget, Protocol):
    """What Fabric's model-parallel check may use of the strategy (:class:`FabricModelParallelStrategy`)."""

    #: Whether no ``parallelize_fn`` was given (:func:`fully_shard_data_parallel` stands in).
    default_parallelize: bool


def size_fsdp2_mesh(strategy: DistributedTarget) -> None:
    """Pure FSDP2 (``tensor_parallel_size=1``): every process in the sharding dimension.

    Lightning's ``data_parallel_size="auto"`` would make it the number of nodes.
    """
    data_parallel_size, tensor_parallel_size = _lightning.model_parallel_sizes(strategy)
    if tensor_parallel_size == 1 and data_parallel_size == "auto":
        _lightning.set_data_parallel_size(strategy, strategy.num_nodes * strategy.num_processes)


def check_parallelize_fn(strategy: FabricModelParallelTarget) -> None:
    """Fabric: refuse tensor parallelism without the user's ``parallelize_fn`` (no plan can be guessed)."""
    tensor_parallel_size = _lightning.model_parallel_sizes(strategy)[1]
    if strategy.default_parallelize and tensor_parallel_size != 1:
        raise ShardingNotSupportedError(
            f"{type(strategy).__name__}(tensor_parallel_size={tensor_parallel_size!r}) needs your"
            " parallelize_fn: Fabric cannot guess a tensor-parallel plan. Pass"
            " AnyModelParallelStrategy(parallelize_fn=...), or use strategy='any_fsdp2' (FSDP2 only)."
        )


#: What a model-parallel strategy does at setup, in order (launching process: the ``before_launch`` steps).
SETUP: Setup = (
    before_launch(check_collectives),
    *launch_checks(),
    *BEFORE_JOIN,
    in_worker(size_fsdp2_mesh),
    in_worker(lightning_setup_within_deadline),
    *AFTER_JOIN,
)

#: Fabric's: the same, and the ``parallelize_fn`` check last before launching.
FABRIC_SETUP: Setup = with_launch_check(SETUP, check_parallelize_fn)

#: The names the family registers with each front end: Lightning's defaults, and pure FSDP2 (``tensor_parallel_size=1``).
NAMES: dict[str, Registered] = {
    # Lightning registers no name for its ModelParallelStrategy
    "any_model_parallel": Registered("FSDP2 + tensor parallel on the accelerator's device type", {}, ()),
    "any_fsdp2": Registered("FSDP2 (fully_shard) on the accelerator's device type", {"tensor_parallel_size": 1}, ()),
}


def reduce_gradients_with_sum(module: Module) -> None:
    """Make every FSDP2 part of ``module`` reduce-scatter its gradients with a sum, then divide.

    torch's FSDP2 reduces float32/bfloat16 gradients with ``ReduceOp.AVG``, which some vendors'
    collective libraries refuse, on some paths only (docs/limitations.md). Its
    ``set_force_sum_reduction_for_comms(True)`` makes it sum and divide by the group's size itself
    (what it always does for float16). On a torch without that method FSDP2 keeps ``AVG``.
    """
    from torch.distributed.fsdp import FSDPModule

    for part in module.modules():
        force_sum = getattr(part, "set_force_sum_reduction_for_comms", None)
        if isinstance(part, FSDPModule) and force_sum is not None:
            force_sum(True)


def refuse_unsharded_parameters(module: Module) -> None:
    """Refuse, before fitting, a trainable parameter of ``module`` that no ``fully_shard`` (or tensor parallel plan) manages.

    Such a parameter stays a plain tensor: every rank keeps its own gradient, never averaged, and the
    replicas drift apart silently. A module whose ``allow_unsharded_parameters`` attribute is ``True``
    opts out (it averages those gradients itself).

    Raises:
        ShardingNotSupportedError: naming the parameters and the fix.
    """
    from torch.distributed.tensor import DTensor

    if getattr(module, "allow_unsharded_parameters", False):
        return
    loose = [name for name, p in module.named_parameters() if p.requires_grad and not isinstance(p, DTensor)]
    if loose:
        raise ShardingNotSupportedError(
            f"FSDP2: no fully_shard manages the trainable parameter(s) {', '.join(loose[:5])}"
            f"{f' and {len(loose) - 5} more' if len(loose) > 5 else ''}: their gradients would never be averaged"
            " across processes. Call fully_shard on a module that holds them (e.g. the model's root, last, in"
            " configure_model or the parallelize_fn), or freeze them (requires_grad_(False))."
        )


class AnyModelParallelMixin(AnyShardedMixin):
    """FSDP2 and tensor parallelism through Lightning's ``ModelParallelStrategy`` (either front end).

    Lightning builds its device mesh on ``root_device.type`` already; what the mixin adds is the
    device table's backend, the barrier, the refusal of devices without collectives, and the
    ``any_fsdp2`` layout (:func:`size_fsdp2_mesh`).
    """

    strategy_name: ClassVar[str] = "any_model_parallel"
    setup_steps: ClassVar[Setup] = SETUP
    sharding_name = "FSDP2 (ModelParallelStrategy)"


class AnyModelParallelStrategy(AtomicSaveMixin, AnyModelParallelMixin, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2 + tensor parallel) on the accelerator's device type (Trainer).

    Takes the arguments of ``ModelParallelStrategy``: ``data_parallel_size``, ``tensor_parallel_size``,
    ``save_distributed_checkpoint`` (``True``: a sharded folder; ``False``: one full file),
    ``process_group_backend`` (default: from the device table) and ``timeout``. The setup is :data:`SETUP`.
    """

    @override
    def setup(self, trainer: Any) -> None:
        """Lightning's setup of the model ``configure_model`` sharded, its gradients reduced with a sum."""
        if self.model is not None:
            refuse_unsharded_parameters(self.model)
            reduce_gradients_with_sum(self.model)
        super().setup(trainer)


def fully_shard_data_parallel(module: Module, device_mesh: Any) -> Module:
    """The default ``parallelize_fn`` of Fabric's ``AnyModelParallelStrategy``: FSDP2 over the whole module.

    ``fully_shard`` on ``module`` over the mesh's ``"data_parallel"`` dimension: parameters,
    gradients and optimizer state are split across the processes, and gathered all at once in
    forward and backward. To gather one block at a time, pass your own ``parallelize_fn`` that
    calls ``fully_shard`` on each block first.
    """
    from torch.distributed.fsdp import fully_shard

    # fully_shard returns `module` itself, its class extended with FSDPModule (typed as FSDPModule only)
    return cast(Module, fully_shard(module, mesh=device_mesh["data_parallel"]))


@fabric_class("AnyModelParallelStrategy")
class FabricModelParallelStrategy(FabricProgressMixin, FabricAtomicSaveMixin, AnyModelParallelMixin, FabricModelParallel):
    """Fabric's ``ModelParallelStrategy`` (FSDP2 + tensor parallel) on the accelerator's device type.

    Published as ``lightning_anyaccel.fabric.AnyModelParallelStrategy``. The setup is :data:`FABRIC_SETUP`.

    Args:
        parallelize_fn: ``fn(module, device_mesh) -> module`` applying ``fully_shard`` / tensor
            parallelism (as for Lightning's strategy). ``None`` (default) is
            :func:`fully_shard_data_parallel`, which only makes sense with ``tensor_parallel_size=1``
            (the ``any_fsdp2`` name).
        *args: the other arguments of Fabric's ``ModelParallelStrategy``
            (``data_parallel_size``, ``tensor_parallel_size``, ``save_distributed_checkpoint``, ...).

    Raises:
        ShardingNotSupportedError: no ``parallelize_fn`` with tensor parallelism (``any_model_parallel``).
    """

    _side = FabricSide
    setup_steps: ClassVar[Setup] = FABRIC_SETUP

    def __init__(self, parallelize_fn: Any = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(parallelize_fn or fully_shard_data_parallel, *args, **kwargs)
        self.default_parallelize = parallelize_fn is None

    @override
    def setup_module(self, module: Module) -> Module:
        """Lightning's (the ``parallelize_fn`` shards ``module``), the gradients then reduced with a sum."""
        module = super().setup_module(module)
        refuse_unsharded_parameters(module)
        reduce_gradients_with_sum(module)
        return module


__all__ = ["FABRIC_SETUP", "NAMES", "SETUP", "AnyModelParallelMixin", "AnyModelParallelStrategy",
           "FabricModelParallelStrategy", "fully_shard_data_parallel", "reduce_gradients_with_sum",
           "refuse_unsharded_parameters"]
