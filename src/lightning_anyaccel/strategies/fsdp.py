"""The FSDP family: Lightning's ``FSDPStrategy`` interface (FSDP1) on any device type, for the Trainer and for Fabric.

What Lightning's ``FSDPStrategy`` does that only works on CUDA, and what :class:`AnyFSDPMixin` does instead:

- the connector refuses FSDP unless the accelerator is CUDA: the check is
  ``type(strategy) is FSDPStrategy`` and the registered names, so these subclasses and their own
  names (``any_fsdp``, ``any_fsdp_cpu_offload``) pass;
- ``FullyShardedDataParallel(device_id=root_device.index)``: ``None`` on CPU, which FSDP then
  resolves to "the current accelerator" and fails; here ``device_id`` is the ``torch.device``;
- a ``device_mesh=(replicas, shards)`` tuple becomes ``init_device_mesh("cuda", ...)``;
  here the mesh is built on the strategy's device type;
- ``FSDPPrecision`` autocasts on ``"cuda"`` with a CUDA ``ShardedGradScaler``; here
  :class:`~lightning_anyaccel.device.sharded_precision.AnyFSDPPrecision` on the device type;
- full-state-dict checkpoints gather with ``offload_to_cpu=True``, which segfaults when FSDP
  runs on CPU; here offloading follows the device table (``fsdp_full_state_offload``);
- ``cpu_offload=True`` on CPU fails at the first step (torch pins the offloaded shards, which needs
  an accelerator); here it is refused before any process starts, naming ``any_fsdp``;
- ``FSDPPrecision`` refuses ``gradient_clip_algorithm="norm"`` (it has no reference to the root
  module); here the strategy hands the wrapped root to the precision plugin, which clips with
  ``FullyShardedDataParallel.clip_grad_norm_``.

The Trainer's class is :class:`AnyFSDPStrategy`, Fabric's ``lightning_anyaccel.fabric.AnyFSDPStrategy``
(:class:`FabricFSDPStrategy` here). The module holds the whole family (its steps, :data:`SETUP`,
the shared mixin, both classes and their checkpoint hooks).

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_fsdp", devices=2, logger=False)
    >>> type(trainer.strategy).__name__
    'AnyFSDPStrategy'
    >>> [step.name for step in SETUP][-5:]  # doctest: +NORMALIZE_WHITESPACE
    ['lightning_setup_within_deadline', 'build_device_mesh', 'check_device_precision', 'destroy_process_group_at_exit',
     'watch_stalls']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar, Protocol

import torch
from lightning.fabric.strategies import FSDPStrategy as FabricFSDP
from lightning.pytorch.strategies import FSDPStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.device.devices import is_host
from lightning_anyaccel.device.precision import align_precision_plugin
from lightning_anyaccel.device.sharded_precision import AnyFSDPPrecision
from lightning_anyaccel.front_ends import FabricSide
from lightning_anyaccel.strategies.atomic_save import AtomicSaveMixin, FabricAtomicSaveMixin
from lightning_anyaccel.strategies.base import FabricProgressMixin, Registered, fabric_class
from lightning_anyaccel.strategies.errors import ShardingNotSupportedError
from lightning_anyaccel.strategies.sharded import AnyShardedMixin
from lightning_anyaccel.strategies.steps import (
    AFTER_JOIN,
    BEFORE_JOIN,
    Setup,
    ShardedTarget,
    before_launch,
    check_collectives,
    in_worker,
    launch_checks,
    lightning_setup_within_deadline,
)

# ----- the family's own steps ---------------------------------------------------------------------


class FSDPTarget(ShardedTarget, Protocol):
    """What the FSDP family's steps may use of the strategy (:class:`AnyFSDPMixin`)."""

    cpu_offload: Any
    #: A ``device_mesh`` tuple held back during Lightning's setup (:func:`hold_device_mesh_shape`).
    device_mesh_shape: tuple[int, ...] | None

    @property
    def state_dict_offload(self) -> bool:
        """Whether full state dicts are gathered with ``offload_to_cpu``."""
        ...

    def init_device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Any:
        """A ``DeviceMesh`` of ``shape`` on the strategy's device type."""
        ...


def align_fsdp_precision(strategy: FSDPTarget) -> None:
    """Replace the front end's CUDA-bound ``FSDPPrecision`` with the package's one on the device type."""
    side = strategy.side
    lightning_precision, any_precision = side.fsdp_precision_classes()
    plugin = side.given_precision_plugin(strategy)  # the plugin given, not Lightning's 32-true default
    if isinstance(plugin, lightning_precision) and not isinstance(plugin, any_precision):
        plugin = any_precision(plugin.precision, device=strategy.device_type)
    if plugin is not None:
        side.set_precision_plugin(strategy, align_precision_plugin(plugin, strategy.device_type))


def check_state_dict_offload(strategy: FSDPTarget) -> None:
    """Refuse ``state_dict_offload=True`` for full state dicts where torch crashes on it (CPU).

    Unless given, :attr:`~AnyFSDPMixin.state_dict_offload` is the table's ``fsdp_full_state_offload``,
    which passes.
    """
    spec = strategy.spec
    state_dict_type = _lightning.fsdp_state_dict_type(strategy)
    if strategy.state_dict_offload and state_dict_type == "full" and not spec.fsdp_full_state_offload:
        raise ShardingNotSupportedError(
            f"{type(strategy).__name__}(state_dict_offload=True, state_dict_type='full') on {spec.name}: torch's"
            " FSDP frees storage it still reads when it 'offloads' tensors that already live on CPU, and the"
            " process crashes (Lightning-AI/pytorch-lightning#21804). Leave state_dict_offload unset, or use"
            " state_dict_type='sharded'."
        )


def check_cpu_offload(strategy: FSDPTarget) -> None:
    """Refuse ``cpu_offload`` (``any_fsdp_cpu_offload``) where the parameters already live in host memory (CPU).

    There is nothing to offload to, and torch's FSDP pins the offloaded shards, which needs an
    accelerator: without one every rank fails at its first step with "Cannot access accelerator
    device when none is available".
    """
    if getattr(strategy.cpu_offload, "offload_params", False) and is_host(strategy.device_type):
        raise ShardingNotSupportedError(
            f"{type(strategy).__name__}(cpu_offload=True) (the name 'any_fsdp_cpu_offload') on {strategy.spec.name}:"
            " the parameters already live in host memory, and torch's FSDP pins offloaded shards, which needs an"
            " accelerator. Use strategy='any_fsdp' on CPU; CPU offload is for accelerators."
        )


def hold_device_mesh_shape(strategy: FSDPTarget) -> None:
    """Take a ``device_mesh=(replicas, shards)`` tuple out of the FSDP arguments before Lightning's setup.

    Lightning would build it with ``init_device_mesh("cuda", ...)``; :func:`build_device_mesh` builds it.
    """
    options = strategy.side.fsdp_options(strategy)
    shape = options.get("device_mesh")
    strategy.device_mesh_shape = shape if isinstance(shape, tuple) else None
    if isinstance(shape, tuple):
        del options["device_mesh"]


def build_device_mesh(strategy: FSDPTarget) -> None:
    """Build the mesh held by :func:`hold_device_mesh_shape` on the strategy's device type (needs the group)."""
    shape = strategy.device_mesh_shape
    if shape is not None:
        strategy.side.fsdp_options(strategy)["device_mesh"] = strategy.init_device_mesh(shape, ("replicate", "shard"))


#: What an FSDP strategy does at setup, in order (launching process: the ``before_launch`` steps).
SETUP: Setup = (
    before_launch(check_collectives),
    *launch_checks(align=align_fsdp_precision),
    before_launch(check_state_dict_offload),
    before_launch(check_cpu_offload),
    *BEFORE_JOIN,
    in_worker(hold_device_mesh_shape),
    in_worker(lightning_setup_within_deadline),
    in_worker(build_device_mesh),
    *AFTER_JOIN,
)

#: The names the family registers with each front end (``any_fsdp_cpu_offload``: parameters offloaded to host memory).
NAMES: dict[str, Registered] = {
    "any_fsdp": Registered("FSDP on the accelerator's device type", {}),
    "any_fsdp_cpu_offload": Registered(
        "FSDP on the accelerator's device type, parameters offloaded to CPU", {"cpu_offload": True}),
}


def full_state_dict_context(module: torch.nn.Module, offload: bool, rank0_only: bool = True) -> AbstractContextManager:
    """FSDP's full-state-dict mode for ``module``, offloading gathered tensors to CPU only if ``offload``.

    Lightning's own helper (both front ends) always offloads, which crashes torch when FSDP runs
    on CPU (see :attr:`~lightning_anyaccel.device.devices.DeviceSpec.fsdp_full_state_offload`).
    """
    from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=rank0_only),
    )


class AnyFSDPMixin(AnyShardedMixin):
    """FSDP (Lightning's ``FSDPStrategy`` interface) on the device type, for the Trainer and for Fabric.

    Mixed in before either front end's ``FSDPStrategy``; what differs between them is asked from
    the front-end adapter (:attr:`side`). The front-end classes only route their hooks
    (``_setup_model``/``setup_module``, ``model_sharded_context``/``module_sharded_context``,
    checkpoint hooks) to the methods here.

    Args:
        state_dict_offload: move gathered full-state-dict tensors to CPU while saving
            (``state_dict_type="full"``). ``None`` (default) takes the device table's
            ``fsdp_full_state_offload`` (on except on CPU, where it crashes torch).
        kwargs: the front end's ``FSDPStrategy`` arguments (positional ones pass through too).
    """

    strategy_name: ClassVar[str] = "any_fsdp"
    setup_steps: ClassVar[Setup] = SETUP
    sharding_name = "FSDP"
    #: A ``device_mesh`` tuple held back during Lightning's setup (:func:`hold_device_mesh_shape`).
    device_mesh_shape: tuple[int, ...] | None = None
    cpu_offload: Any
    sharding_strategy: Any
    mixed_precision_config: Any

    def __init__(self, *args: Any, state_dict_offload: bool | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._state_dict_offload = state_dict_offload

    @property
    def state_dict_offload(self) -> bool:
        """Whether full state dicts are gathered with ``offload_to_cpu`` (the table decides unless given)."""
        if self._state_dict_offload is not None:
            return self._state_dict_offload
        return self.spec.fsdp_full_state_offload

    def _fsdp_wrap_kwargs(self) -> dict[str, Any]:
        """Arguments for every ``FullyShardedDataParallel`` the strategy builds: ``device_id`` is the device.

        Lightning passes ``root_device.index``: ``None`` on CPU, which FSDP resolves to "the
        current accelerator" and fails.
        """
        return dict(
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self.root_device,
            **self.side.fsdp_options(self),
        )

    def _wrap_fsdp(self, module: torch.nn.Module, already_wrapped: Callable[[], Any]) -> Any:
        """Wrap ``module`` in FSDP on the device; ``already_wrapped()`` (Lightning's path) when the user did."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(submodule, FullyShardedDataParallel) for submodule in module.modules()):
            return already_wrapped()
        wrapped = FullyShardedDataParallel(module=module, **self._fsdp_wrap_kwargs())
        _lightning.move_torchmetrics_to_device(wrapped, self.root_device)
        _lightning.setup_activation_checkpointing(wrapped, _lightning.fsdp_activation_checkpointing_kwargs(self))
        return wrapped

    def _fsdp_enable_wrap(self) -> AbstractContextManager:
        """``enable_wrap`` with :meth:`_fsdp_wrap_kwargs`, for the sharded-init contexts."""
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        return enable_wrap(wrapper_cls=FullyShardedDataParallel, **self._fsdp_wrap_kwargs())

    def _full_state_dict_context(self, module: torch.nn.Module, rank0_only: bool = True) -> AbstractContextManager:
        """FSDP's full-state-dict mode, offloading to CPU only where :attr:`state_dict_offload` allows it."""
        return full_state_dict_context(module, self.state_dict_offload, rank0_only)



class AnyFSDPStrategy(AtomicSaveMixin, AnyFSDPMixin, FSDPStrategy):
    """Fully Sharded Data Parallel (``torch.distributed.fsdp``) on the accelerator's device type (Trainer).

    Takes every argument of Lightning's ``FSDPStrategy`` (``sharding_strategy``, ``state_dict_type``
    ``"full"``/``"sharded"``, ``auto_wrap_policy``, ``cpu_offload``, ``device_mesh``, ...), plus:

    Args:
        state_dict_offload: move gathered full-state-dict tensors to CPU while saving
            (``state_dict_type="full"``). ``None`` (default) takes the device table's
            ``fsdp_full_state_offload`` (on except on CPU, where it crashes torch).

    Raises:
        ShardingNotSupportedError: ``state_dict_offload=True`` on a device where torch cannot do
            it, or a device without collectives (``mps``).
    """

    @override
    def _setup_model(self, model: Module) -> Module:
        """Wrap ``model`` in FSDP with ``device_id=root_device`` (Lightning passes its index, ``None`` on CPU).

        The precision plugin gets the root module, to clip gradients by norm across all shards.
        """
        wrapped = self._wrap_fsdp(model, functools.partial(super()._setup_model, model))
        if isinstance(self.precision_plugin, AnyFSDPPrecision):
            self.precision_plugin.fsdp_module = wrapped
        return wrapped

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        with self._fsdp_enable_wrap():
            yield

    # ----- checkpoints: full state dicts offload only where the device table allows it ---------

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        if _lightning.fsdp_state_dict_type(self) != "full":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with self._full_state_dict_context(self.model):
            return self.model.state_dict()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if _lightning.fsdp_state_dict_type(self) != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        optimizer = _lightning.unwrap_lightning_optimizer(optimizer, self.side.package)
        assert self.model is not None
        with self._full_state_dict_context(self.model):
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard (parameter-id keyed) format, as Lightning writes it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


@fabric_class("AnyFSDPStrategy")
class FabricFSDPStrategy(FabricProgressMixin, FabricAtomicSaveMixin, AnyFSDPMixin, FabricFSDP):
    """Fabric's ``FSDPStrategy`` (FSDP1) on the accelerator's device type.

    Published as ``lightning_anyaccel.fabric.AnyFSDPStrategy``. Takes every argument of Fabric's
    ``FSDPStrategy`` (``sharding_strategy``, ``state_dict_type`` ``"sharded"``/``"full"``,
    ``auto_wrap_policy``, ``cpu_offload``, ``device_mesh``, ...), plus ``state_dict_offload`` (see
    :class:`AnyFSDPMixin`). Registered as ``any_fsdp`` and ``any_fsdp_cpu_offload``; mixed precision
    uses :class:`~lightning_anyaccel.device.sharded_precision.AnyFabricFSDPPrecision`.

    Example:
        >>> from lightning import Fabric
        >>> import lightning_anyaccel
        >>> fabric = Fabric(accelerator="any", strategy="any_fsdp", devices=2, precision="bf16-mixed")
        >>> type(fabric.strategy).__name__, fabric.strategy.precision.device
        ('AnyFSDPStrategy', 'cpu')
    """

    _side = FabricSide

    @override
    def setup_module(self, module: Module) -> Module:
        """Wrap ``module`` in FSDP with ``device_id=root_device`` (Lightning passes its index, ``None`` on CPU)."""
        return self._wrap_fsdp(module, functools.partial(super().setup_module, module))

    @override
    def module_sharded_context(self) -> AbstractContextManager:
        return self._fsdp_enable_wrap()

    @contextmanager
    def _lightning_full_state_dict(self) -> Generator[None, None, None]:
        """Make Lightning's checkpoint code gather full state dicts through :meth:`_full_state_dict_context`.

        Fabric's ``save_checkpoint``/``load_checkpoint`` call a module-level helper that always
        offloads to CPU (a crash when FSDP runs on CPU). For the duration of the call, that helper
        (in both modules that use it) is replaced by one that follows :attr:`state_dict_offload`.
        """
        if self.state_dict_offload:
            yield
            return

        def helper(module: Module, world_size: int = 1, rank0_only: bool = True) -> AbstractContextManager:
            return self._full_state_dict_context(module, rank0_only)

        with _lightning.full_state_dict_context_replaced(self.side.package, helper):
            yield

    @override
    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Fabric's save; a full state dict is gathered without offloading where the device table says so."""
        with self._lightning_full_state_dict():
            super().save_checkpoint(*args, **kwargs)

    @override
    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Fabric's load; a full checkpoint is loaded in the same full-state-dict mode as it was saved."""
        with self._lightning_full_state_dict():
            return super().load_checkpoint(*args, **kwargs)


__all__ = ["NAMES", "SETUP", "AnyFSDPMixin", "AnyFSDPStrategy", "FabricFSDPStrategy", "full_state_dict_context"]
