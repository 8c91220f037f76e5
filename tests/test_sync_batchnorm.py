"""``sync_batchnorm=True`` through the package's strategies: which layers the model gets, in one process.

The numerics (2 processes against BatchNorm on the full batch) and training with it run in the
workload job (``tests/test_workloads.py``).
"""

from __future__ import annotations

import lightning as L
import torch

from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.device.sync_batchnorm import DeviceLayerSync, DeviceSyncBatchNorm, has_sync_batchnorm_kernels


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.BatchNorm1d(4))


def test_the_strategy_syncs_batchnorm_with_what_runs_on_the_device():
    trainer = L.Trainer(accelerator=AnyAccelerator("cpu"), strategy="any_ddp", devices=2, sync_batchnorm=True,
                        logger=False)
    plugin = trainer.strategy._layer_sync
    assert isinstance(plugin, DeviceLayerSync)
    assert not has_sync_batchnorm_kernels(torch.device("cpu"))  # torch's SyncBatchNorm cannot run on CPU
    model = plugin.apply(_cnn())
    assert [type(m) for m in model[1:]] == [DeviceSyncBatchNorm, DeviceSyncBatchNorm]
    reverted = plugin.revert(model)
    assert not any(isinstance(m, (DeviceSyncBatchNorm, torch.nn.SyncBatchNorm)) for m in reverted.modules())


def test_device_sync_batchnorm_is_batchnorm_in_one_process():
    torch.manual_seed(0)
    reference = torch.nn.BatchNorm2d(3)
    synced = DeviceSyncBatchNorm(3)
    x = torch.randn(6, 3, 4, 4) * 2 + 1
    torch.testing.assert_close(synced(x), reference(x))
    torch.testing.assert_close(synced.running_var, reference.running_var)
    synced.eval(), reference.eval()
    torch.testing.assert_close(synced(x), reference(x))
