"""What the package knows about one device type: :class:`DeviceSpec`, the record the device table holds.

Its fields default to what PyTorch itself reports; :mod:`lightning_anyaccel.device.table` sets the
ones that differ for the device types the project has met, and
:func:`lightning_anyaccel.device.devices.get_spec` combines both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

MemoryStatsSource = Literal["accelerator", "device_module", "mps", "cpu"]

#: Precision flag -> the autocast dtype name it needs.
PRECISION_DTYPES: dict[str, str] = {"bf16-mixed": "bf16", "16-mixed": "fp16"}


@dataclass(frozen=True)
class DeviceSpec:
    """What the package knows about one ``torch.device`` type.

    Attributes:
        type: the ``torch.device`` type string (``"xpu"``, ``"hpu"``, ...).
        name: a human-readable name for messages and docs.
        backend: the ``torch.distributed`` backend for collectives on this device, or ``None``
            when the device has no multi-process support.
        autocast_dtypes: the dtypes ``torch.autocast`` supports on this device (``"bf16"``,
            ``"fp16"``), in order of preference.
        vendor_module: the Python module that registers the device with PyTorch, or ``None``
            when stock PyTorch builds know it.
        backend_module: the Python module that registers ``backend`` with ``torch.distributed``,
            when importing ``vendor_module`` does not.
        install: how to get a PyTorch that sees this device (shown in errors and docs).
        private_use1: ``True`` when the device is a PrivateUse1 backend renamed by its vendor.
        seeded_by_torch: whether ``torch.manual_seed`` already seeds this device's generator.
        seed_functions: device-module functions that seed every device, tried in order.
        memory_stats: where memory statistics come from (``torch.accelerator``, the device
            module, MPS's own counters, or the host for CPU).
        fork_safe_after_init: whether a process may ``fork`` after it initialised the device.
        lightning_builtin: the name of Lightning's own accelerator for this device, if any.
            Such names stay Lightning's; ours is reachable as an instance or as ``"any"``.
        profiler_activity: the ``torch.profiler.ProfilerActivity`` name for this device.
        fsdp_full_state_offload: whether FSDP may ``offload_to_cpu`` while gathering a full state
            dict. ``False`` for CPU: the "offload" is a no-op there and torch frees the storage it
            is still reading (segfault; Lightning-AI/pytorch-lightning#21804, pytorch/pytorch#188989).
        process_device_env: ``None`` when a process sees every device of the machine and binds to
            ``<type>:LOCAL_RANK``. Otherwise each process sees only the one card its vendor runtime
            gave it, always as ``<type>:0``, and this names the variable that chooses which cards the
            local ranks get. Gaudi: the HCCL backend gives local rank *i* the module ID *i*, or the
            *i*-th entry of ``HABANA_VISIBLE_MODULES`` (Intel Gaudi documentation, "Gaudi-to-process
            Assignment"); every rank's device is ``hpu:0``.
        host: ``True`` for the host itself (CPU): one unnumbered device (``cpu``, never ``cpu:1``) in
            host memory, always available, never initialised, with nothing to select, seed or empty.
            What the package does differently there asks this field, never the device's name.
        notes: one line for the support matrix.
        count_hint: what to check when fewer devices are visible than asked for (added to that error),
            e.g. how the device's runtime splits a card into several devices.
    """

    type: str
    name: str
    backend: str | None
    autocast_dtypes: tuple[str, ...]
    vendor_module: str | None = None
    backend_module: str | None = None
    install: str = ""
    private_use1: bool = False
    seeded_by_torch: bool = True
    seed_functions: tuple[str, ...] = ("manual_seed_all",)
    memory_stats: MemoryStatsSource = "accelerator"
    fork_safe_after_init: bool = False
    lightning_builtin: str | None = None
    profiler_activity: str | None = None
    fsdp_full_state_offload: bool = True
    process_device_env: str | None = None
    host: bool = False
    notes: str = ""
    count_hint: str = ""

    def supports_precision(self, precision: str) -> bool:
        """Whether a mixed ``precision`` flag can autocast on this device.

        >>> from lightning_anyaccel.device.devices import get_spec
        >>> get_spec("mps").supports_precision("16-mixed")
        True
        """
        dtype = PRECISION_DTYPES.get(precision)
        return dtype is None or dtype in self.autocast_dtypes

    def device(self, index: int = 0) -> torch.device:
        """Device ``index`` of this type (``xpu:1``); the host has one unnumbered device (``cpu``).

        >>> from lightning_anyaccel.device.devices import get_spec
        >>> get_spec("xpu").device(1), get_spec("cpu").device(1)
        (device(type='xpu', index=1), device(type='cpu'))
        """
        return torch.device(self.type) if self.host else torch.device(self.type, index)


__all__ = ["PRECISION_DTYPES", "DeviceSpec", "MemoryStatsSource"]
