"""``AnyFSDPStrategy``: Lightning's ``FSDPStrategy`` interface (FSDP1) on any device type.

What Lightning's ``FSDPStrategy`` does that only works on CUDA, and what this subclass does instead:

- the connector refuses FSDP unless the accelerator is CUDA (audit row 7): the check is
  ``type(strategy) is FSDPStrategy`` and the registered names, so this subclass and its own
  names (``any_fsdp``, ``any_fsdp_cpu_offload``) pass;
- ``FullyShardedDataParallel(device_id=root_device.index)``: ``None`` on CPU, which FSDP then
  resolves to "the current accelerator" and fails; here ``device_id`` is the ``torch.device``;
- a ``device_mesh=(replicas, shards)`` tuple becomes ``init_device_mesh("cuda", ...)`` (row 25);
  here the mesh is built on the strategy's device type;
- ``FSDPPrecision`` autocasts on ``"cuda"`` with a CUDA ``ShardedGradScaler`` (row 9); here
  :class:`~lightning_anyaccel.sharded_precision.AnyFSDPPrecision` on the device type;
- full-state-dict checkpoints gather with ``offload_to_cpu=True``, which segfaults when FSDP
  runs on CPU; here offloading follows the device table (``fsdp_full_state_offload``);
- ``FSDPPrecision`` refuses ``gradient_clip_algorithm="norm"`` (it has no reference to the root
  module); here the strategy hands the wrapped root to the precision plugin, which clips with
  ``FullyShardedDataParallel.clip_grad_norm_``.

Example:
    >>> from lightning import Trainer
    >>> import lightning_anyaccel
    >>> trainer = Trainer(accelerator="any", strategy="any_fsdp", devices=2, logger=False)
    >>> type(trainer.strategy).__name__
    'AnyFSDPStrategy'
"""

from __future__ import annotations

import functools

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_anyaccel import _lightning
from lightning_anyaccel.checkpoint import AtomicSaveMixin
from lightning_anyaccel.sharded_precision import AnyFSDPPrecision
from lightning_anyaccel.strategies.sharding import AnyFSDPMixin


class AnyFSDPStrategy(AtomicSaveMixin, AnyFSDPMixin, FSDPStrategy):
    """Fully Sharded Data Parallel (``torch.distributed.fsdp``) on the accelerator's device type.

    Takes every argument of Lightning's ``FSDPStrategy`` (``sharding_strategy``, ``state_dict_type``
    ``"full"``/``"sharded"``, ``auto_wrap_policy``, ``cpu_offload``, ``device_mesh``, ...), plus:

    Args:
        state_dict_offload: move gathered full-state-dict tensors to CPU while saving
            (``state_dict_type="full"``). ``None`` (default) takes the device table's
            ``fsdp_full_state_offload`` (on except on CPU, where it crashes torch).

    Raises:
        ShardingNotSupportedError: ``state_dict_offload=True`` on a device where torch cannot do
            it, or a device without collectives (``mps``).

    The device logic is :class:`~lightning_anyaccel.strategies.sharding.AnyFSDPMixin`, shared with
    Fabric's :class:`lightning_anyaccel.fabric.AnyFSDPStrategy`.
    """

    _fsdp_kwargs_attr = "kwargs"
    _lightning_fsdp_precision = FSDPPrecision
    _any_fsdp_precision = AnyFSDPPrecision

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

    @override
    def barrier(self, name: str | None = None) -> None:
        self._barrier()

    # ----- checkpoints: full state dicts offload only where the device table allows it ---------

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with self._full_state_dict_context(self.model):
            return self.model.state_dict()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        if self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if isinstance(optimizer, _lightning.port(LightningOptimizer, self._front_end)):
            optimizer = optimizer._optimizer
        assert self.model is not None
        with self._full_state_dict_context(self.model):
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard (parameter-id keyed) format, as Lightning writes it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


__all__ = ["AnyFSDPStrategy"]
