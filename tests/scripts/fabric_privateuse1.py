"""Simulate an Ascend NPU (a PrivateUse1 device) in this process and print what Fabric does with it.

PrivateUse1 can be renamed once per process, so the tests run this as a subprocess. It renames
PrivateUse1 to ``npu`` and registers a fake ``torch.npu`` module, as ``torch_npu`` would, then
prints one JSON line: the device and precision device Fabric chose, the error for an
unregistered backend, and the backend once a "vendor" registered one for ``npu``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
import torch.distributed as dist

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module(
    "npu",
    SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 2, is_initialized=lambda: False,
        set_device=lambda index: None, is_bf16_supported=lambda: True, manual_seed_all=lambda seed: None,
        empty_cache=lambda: None, get_amp_supported_dtype=lambda: [torch.float16, torch.bfloat16],
    ),
)

from lightning import Fabric  # noqa: E402

import lightning_anyaccel  # noqa: E402,F401
from lightning_anyaccel.device.distributed import BackendError  # noqa: E402

result: dict[str, str] = {}
fabric = Fabric(accelerator="npu", strategy="any_single", devices=[1], precision="bf16-mixed")
result["device"] = str(fabric.device)
result["precision_device"] = fabric._precision.device
try:
    Fabric(accelerator="npu", strategy="any_ddp", devices=2)
except BackendError as err:
    result["unregistered"] = f"BackendError: {str(err).split(' in this PyTorch')[0]}"
dist.Backend.register_backend("hccl", lambda *args, **kwargs: None, devices=["npu"])  # what torch_npu does
result["vendor_registered_backend"] = Fabric(accelerator="npu", strategy="any_ddp", devices=2).strategy._get_process_group_backend()
print(json.dumps(result))
