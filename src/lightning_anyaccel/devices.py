"""The device table: everything the package knows about each device type, in one place.

Every class in :mod:`lightning_anyaccel` asks this table instead of branching on device
names, and the documentation's support matrix is generated from it, so code and docs
cannot drift. To support a new device type, add one :class:`DeviceSpec` to
:data:`DEVICE_TABLE` (or call :func:`register_device` at runtime).

Example:
    >>> from lightning_anyaccel.devices import get_spec
    >>> get_spec("xpu").backend
    'xccl'
    >>> get_spec("cpu").autocast_dtypes
    ('bf16', 'fp16')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
        deepspeed_accelerator: the name DeepSpeed's accelerator layer (``DS_ACCELERATOR``) uses for
            this device, or ``None`` when DeepSpeed does not run on it (checked against deepspeed
            0.19.8's ``SUPPORTED_ACCELERATOR_LIST``).
        fsdp_full_state_offload: whether FSDP may ``offload_to_cpu`` while gathering a full state
            dict. ``False`` for CPU: the "offload" is a no-op there and torch frees the storage it
            is still reading (segfault; Lightning-AI/pytorch-lightning#21804, pytorch/pytorch#188989).
        process_device_env: ``None`` when a process sees every device of the machine and binds to
            ``<type>:<local rank>``. Otherwise each process sees only the one card its vendor runtime
            gave it, always as ``<type>:0``, and this names the variable that chooses which cards the
            local ranks get. Gaudi: the HCCL backend gives local rank *i* the module ID *i*, or the
            *i*-th entry of ``HABANA_VISIBLE_MODULES`` (Intel Gaudi documentation, "Gaudi-to-process
            Assignment"); every rank's device is ``hpu:0``.
        notes: one line for the support matrix.
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
    deepspeed_accelerator: str | None = None
    fsdp_full_state_offload: bool = True
    process_device_env: str | None = None
    notes: str = ""

    def supports_precision(self, precision: str) -> bool:
        """Whether a mixed ``precision`` flag can autocast on this device.

        >>> get_spec("mps").supports_precision("16-mixed")
        True
        """
        dtype = PRECISION_DTYPES.get(precision)
        return dtype is None or dtype in self.autocast_dtypes


DEVICE_TABLE: dict[str, DeviceSpec] = {
    spec.type: spec
    for spec in (
        DeviceSpec(
            type="cpu",
            name="CPU",
            backend="gloo",
            autocast_dtypes=("bf16", "fp16"),
            install="any PyTorch build",
            seed_functions=(),
            memory_stats="cpu",
            fork_safe_after_init=True,
            lightning_builtin="cpu",
            profiler_activity="CPU",
            notes="Processes, not devices: `devices=N` starts N processes.",
            deepspeed_accelerator="cpu",
            fsdp_full_state_offload=False,
        ),
        DeviceSpec(
            type="cuda",
            name="NVIDIA GPU (CUDA) / AMD GPU (ROCm)",
            backend="nccl",
            autocast_dtypes=("bf16", "fp16"),
            install="the CUDA or ROCm build from pytorch.org",
            lightning_builtin="cuda",
            profiler_activity="CUDA",
            notes="Lightning has its own CUDAAccelerator; ours gives the same behaviour through the generic path.",
            deepspeed_accelerator="cuda",
        ),
        DeviceSpec(
            type="xpu",
            name="Intel GPU (XPU)",
            backend="xccl",
            autocast_dtypes=("bf16", "fp16"),
            install="pip install torch --index-url https://download.pytorch.org/whl/xpu",
            profiler_activity="XPU",
            notes="Stock PyTorch >= 2.8 ships XCCL; intel_extension_for_pytorch is not needed.",
            deepspeed_accelerator="xpu",
        ),
        DeviceSpec(
            type="hpu",
            name="Intel Gaudi (HPU)",
            backend="hccl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="habana_frameworks.torch",
            backend_module="habana_frameworks.torch.distributed.hccl",
            install="the Intel Gaudi software stack's PyTorch (never reinstall torch over it)",
            seeded_by_torch=False,
            seed_functions=("manual_seed_all", "manual_seed"),
            memory_stats="device_module",
            profiler_activity="HPU",
            notes="torch's backend map says 'fake' for hpu once Lightning is imported; we use hccl.",
            deepspeed_accelerator="hpu",
            process_device_env="HABANA_VISIBLE_MODULES",
        ),
        DeviceSpec(
            type="npu",
            name="Huawei Ascend (NPU)",
            backend="hccl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="torch_npu",
            install="pip install torch_npu matching your torch version (Ascend CANN required)",
            private_use1=True,
            memory_stats="device_module",
            profiler_activity="PrivateUse1",
            deepspeed_accelerator="npu",
        ),
        DeviceSpec(
            type="sdaa",
            name="Teco SDAA",
            backend="tccl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="torch_sdaa",
            install="Teco's torch_sdaa package for your torch version",
            private_use1=True,
            memory_stats="device_module",
            profiler_activity="PrivateUse1",
        ),
        DeviceSpec(
            type="mlu",
            name="Cambricon MLU",
            backend="cncl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="torch_mlu",
            install="Cambricon's torch_mlu package for your torch version",
            private_use1=True,
            memory_stats="device_module",
            profiler_activity="PrivateUse1",
        ),
        DeviceSpec(
            type="musa",
            name="Moore Threads MUSA",
            backend="mccl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="torch_musa",
            install="Moore Threads' torch_musa package for your torch version",
            private_use1=True,
            memory_stats="device_module",
            profiler_activity="PrivateUse1",
        ),
        DeviceSpec(
            type="mps",
            name="Apple GPU (MPS)",
            backend=None,
            autocast_dtypes=("bf16", "fp16"),
            seed_functions=("manual_seed",),
            memory_stats="mps",
            lightning_builtin="mps",
            notes="One device per machine: single-device training only.",
        ),
    )
}


def register_device(spec: DeviceSpec) -> None:
    """Add or replace a device type at runtime (for a vendor not in the table yet).

    >>> register_device(DeviceSpec(type="foo", name="Foo", backend="fooccl", autocast_dtypes=("bf16",)))
    >>> get_spec("foo").backend
    'fooccl'
    >>> del DEVICE_TABLE["foo"]
    """
    DEVICE_TABLE[spec.type] = spec


def get_spec(device_type: str) -> DeviceSpec:
    """The :class:`DeviceSpec` for ``device_type``.

    Unknown types raise a ``ValueError`` that lists the known ones and says how to add one.

    >>> get_spec("hpu").name
    'Intel Gaudi (HPU)'
    """
    try:
        return DEVICE_TABLE[device_type]
    except KeyError:
        known = ", ".join(sorted(DEVICE_TABLE))
        raise ValueError(
            f"Unknown device type {device_type!r}. Known device types: {known}."
            " Pass one of these, or describe a new one with"
            " `lightning_anyaccel.devices.register_device(DeviceSpec(...))`."
        ) from None
