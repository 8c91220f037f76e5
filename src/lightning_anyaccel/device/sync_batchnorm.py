"""Synchronized BatchNorm on every device, for ``Trainer(sync_batchnorm=True)``.

torch's ``SyncBatchNorm`` runs only where the device has its kernels (``batch_norm_stats``,
``batch_norm_gather_stats_with_counts``, ``batch_norm_elemt`` and the two backward ones): CUDA
and some vendor builds. On CPU it refuses ("SyncBatchNorm expected input tensor to be on GPU"),
and on a device without the kernels it fails at the first step ("Could not run
'aten::batch_norm_stats'"). Lightning's ``sync_batchnorm=True`` always converts to torch's.

:class:`DeviceSyncBatchNorm` computes the same batch statistics with ordinary tensor operations
and the process group's ``all_reduce``, made differentiable (:func:`all_reduce_sum`: the backward
pass all-reduces the gradients of the statistics, so the gradients are those of BatchNorm over the
global batch). :class:`DeviceLayerSync` is what the package's
strategies use for ``sync_batchnorm=True``: torch's ``SyncBatchNorm`` where
:func:`has_sync_batchnorm_kernels` says the device runs it, :class:`DeviceSyncBatchNorm` elsewhere.

Example:
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    >>> type(convert_sync_batchnorm(model)[1]).__name__
    'DeviceSyncBatchNorm'
    >>> has_sync_batchnorm_kernels(torch.device("cpu"))
    False
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from typing_extensions import override

from lightning_anyaccel import _lightning

log = logging.getLogger(__name__)

_PROBED: dict[str, bool] = {}


def has_sync_batchnorm_kernels(device: torch.device) -> bool:
    """Whether torch's ``SyncBatchNorm`` kernels run on ``device`` (probed once per device type).

    Runs each kernel torch's ``SyncBatchNorm`` calls (forward and backward) on a 2x1 tensor; any
    failure (the kernel is not registered for the device) means no.
    """
    if device.type in _PROBED:
        return _PROBED[device.type]
    try:
        x = torch.ones(2, 1, device=device)
        weight, eps = torch.ones(1, device=device), 1e-5
        mean, invstd = torch.batch_norm_stats(x, eps)
        counts = torch.full((1,), 2.0, device=device)
        mean, invstd = torch.batch_norm_gather_stats_with_counts(
            x, mean[None], invstd[None], None, None, 0.1, eps, counts
        )
        torch.batch_norm_elemt(x, weight, torch.zeros(1, device=device), mean, invstd, eps)
        sum_dy, sum_dy_xmu, _, _ = torch.batch_norm_backward_reduce(x, x, mean, invstd, weight, True, True, True)
        torch.batch_norm_backward_elemt(
            x, x, mean, invstd, weight, sum_dy, sum_dy_xmu, torch.full((1,), 2, dtype=torch.int32, device=device)
        )
        found = True
    except (RuntimeError, NotImplementedError):
        found = False
    _PROBED[device.type] = found
    return found


class _AllReduceSum(torch.autograd.Function):
    """``all_reduce`` (sum) whose backward all-reduces the gradient: every rank's output depends on every input."""

    @staticmethod
    @override
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        tensor = tensor.clone()
        dist.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    @override
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(tensor: Tensor, group: Any) -> Tensor:
    """The sum of ``tensor`` over the processes of ``group``, differentiable."""
    return _AllReduceSum.apply(tensor, group)


#: torch's base class of every BatchNorm (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``): parameters, buffers, reset.
_BatchNormBase = _lightning.batchnorm_base()


# The base is looked up at run time (_lightning.private): mypy sees a variable, not a class, hence the ignore.
class DeviceSyncBatchNorm(_BatchNormBase):  # type: ignore[misc,valid-type]
    """``torch.nn.SyncBatchNorm`` built from tensor operations and ``all_reduce``: runs on every device.

    Same arguments, buffers and results as torch's ``SyncBatchNorm`` (mean and biased variance of
    the global batch for normalizing, unbiased variance for the running statistics), in float32
    whatever the input's dtype. Two ``all_reduce`` calls per layer and step (sum and count, then
    the sum of squared deviations), each differentiable. Outside training, or with one process,
    it is plain BatchNorm. Not a ``torch.nn.SyncBatchNorm`` subclass: torch's DDP refuses those on
    CPU ("SyncBatchNorm layers only work with GPU modules").
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, **kwargs: Any) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, **kwargs)
        self.process_group = process_group

    @override
    def forward(self, input: Tensor) -> Tensor:
        """BatchNorm over the batch of every process of :attr:`process_group` (the world by default)."""
        if input.dim() < 2 or input.shape[1] == 0:
            raise ValueError(f"SyncBatchNorm expects an input of shape (N, C, ...) with C > 0, got {tuple(input.shape)}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        group = self.process_group or (dist.group.WORLD if dist.is_available() and dist.is_initialized() else None)
        if not (self.training and group is not None and dist.get_world_size(group) > 1):
            running = not self.training or self.track_running_stats
            return F.batch_norm(
                input, self.running_mean if running else None, self.running_var if running else None,
                self.weight, self.bias, batch_stats, factor, self.eps,
            )
        return self._synchronized(input, group, factor)

    def _synchronized(self, input: Tensor, group: Any, factor: float) -> Tensor:
        dims = [0, *range(2, input.dim())]
        shape = [1, input.shape[1]] + [1] * (input.dim() - 2)
        x = input.float()
        local_count = torch.full((1,), float(x.numel() // x.shape[1]), device=x.device)
        totals = all_reduce_sum(torch.cat([x.sum(dims), local_count]), group=group)
        count = totals[-1]
        mean = totals[:-1] / count
        centered = x - mean.view(shape)
        var = all_reduce_sum((centered * centered).sum(dims), group=group) / count
        out = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.weight is not None:
            out = out * self.weight.float().view(shape)
        if self.bias is not None:
            out = out + self.bias.float().view(shape)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                unbiased = var * count / (count - 1).clamp(min=1)
                self.running_mean.mul_(1 - factor).add_(mean.detach().to(self.running_mean.dtype), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased.detach().to(self.running_var.dtype), alpha=factor)
        return out.to(input.dtype)


def convert_sync_batchnorm(module: torch.nn.Module, process_group: Any = None,
                           to: type[torch.nn.Module] | None = None) -> torch.nn.Module:
    """Replace every BatchNorm in ``module`` by :class:`DeviceSyncBatchNorm` (like torch's ``convert_sync_batchnorm``).

    Parameters and buffers are shared with the replaced layers, not copied. ``to``: the class to
    convert to instead (``torch.nn.SyncBatchNorm`` turns the package's layers back into torch's).
    """
    target = to or DeviceSyncBatchNorm
    converted = module
    if isinstance(module, _BatchNormBase) and type(module) is not target:
        # torch >= 2.9 lets a BatchNorm be affine without a bias (``bias=``); torch 2.8 has no such argument
        no_bias: dict[str, bool] = {"bias": False} if module.affine and module.bias is None else {}
        converted = target(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
            process_group, **no_bias,
        )
        if module.affine:
            converted.weight = module.weight
            converted.bias = module.bias
        converted.running_mean = module.running_mean
        converted.running_var = module.running_var
        converted.num_batches_tracked = module.num_batches_tracked
        converted.training = module.training
    for name, child in module.named_children():
        converted.add_module(name, convert_sync_batchnorm(child, process_group, to))
    return converted


class DeviceLayerSync:
    """The layer-sync plugin of the package's strategies for ``sync_batchnorm=True``.

    Wraps Lightning's ``TorchSyncBatchNorm`` (which the Trainer builds): on a device where
    :func:`has_sync_batchnorm_kernels` is true it converts to torch's ``SyncBatchNorm`` as
    Lightning does, elsewhere to :class:`DeviceSyncBatchNorm` (said once in the log).

    Args:
        lightning_plugin: Lightning's ``TorchSyncBatchNorm`` (either front end); ``revert`` is its own.
        device: returns the device the model trains on (called when the model is converted).
    """

    def __init__(self, lightning_plugin: Any, device: Callable[[], torch.device]) -> None:
        self.lightning_plugin = lightning_plugin
        self._device = device

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Convert every BatchNorm of ``model`` to the synchronized BatchNorm that runs on the device."""
        device = self._device()
        if has_sync_batchnorm_kernels(device):
            return self.lightning_plugin.apply(model)
        log.info(
            "sync_batchnorm=True: %r has no SyncBatchNorm kernels in torch; BatchNorm layers are synchronized"
            " with all_reduce instead (lightning_anyaccel.device.sync_batchnorm.DeviceSyncBatchNorm).", device.type,
        )
        return convert_sync_batchnorm(model)

    def revert(self, model: torch.nn.Module) -> torch.nn.Module:
        """Turn synchronized BatchNorm layers back into BatchNorm (through torch's ``SyncBatchNorm``, which Lightning reverts)."""
        if any(isinstance(m, DeviceSyncBatchNorm) for m in model.modules()):
            model = convert_sync_batchnorm(model, to=torch.nn.SyncBatchNorm)
        return self.lightning_plugin.revert(model)


__all__ = ["DeviceLayerSync", "DeviceSyncBatchNorm", "convert_sync_batchnorm", "has_sync_batchnorm_kernels"]
