"""The device table: the facts about known device types that PyTorch can not tell (data only).

One :class:`~lightning_anyaccel.device.spec.DeviceSpec` per device type the project has met (HPU's
``fake`` backend, the vendor packages to import, FSDP's offload crash on CPU, ...). An entry refines
what :func:`~lightning_anyaccel.device.devices.derive_spec` derives from torch; it is not a
whitelist. The documentation's support matrix is generated from it.
"""

from __future__ import annotations

from lightning_anyaccel.device.spec import DeviceSpec

#: Device type -> its known facts.
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
            fsdp_full_state_offload=False,
            host=True,
        ),
        DeviceSpec(
            type="cuda",
            name="NVIDIA GPU (CUDA)",
            backend="nccl",
            autocast_dtypes=("bf16", "fp16"),
            install="the CUDA build from pytorch.org",
            lightning_builtin="cuda",
            profiler_activity="CUDA",
            notes="Lightning has its own CUDAAccelerator; ours gives the same behaviour through the generic path.",
        ),
        DeviceSpec(
            type="xpu",
            name="Intel GPU (XPU)",
            backend="xccl",
            autocast_dtypes=("bf16", "fp16"),
            install="pip install torch --index-url https://download.pytorch.org/whl/xpu",
            profiler_activity="XPU",
            notes="Stock PyTorch >= 2.8 ships XCCL; intel_extension_for_pytorch is not needed.",
            count_hint=("GPUs of several tiles (Intel Data Center GPU Max, Aurora's 6 per node) show one device per"
                        " tile only with ZE_FLAT_DEVICE_HIERARCHY=FLAT (12 on an Aurora node); COMPOSITE shows one per"
                        " GPU. Set FLAT rather than lowering devices if you meant every tile."),
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
            notes="Every process sees one card, as hpu:0; collectives over hccl.",
            process_device_env="HABANA_VISIBLE_MODULES",
        ),
        DeviceSpec(
            type="npu",
            name="Huawei Ascend (NPU)",
            backend="hccl",
            autocast_dtypes=("bf16", "fp16"),
            vendor_module="torch_npu",
            install="Ascend CANN, then the torch_npu release of your torch's version",
            private_use1=True,
            memory_stats="device_module",
            profiler_activity="PrivateUse1",
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


__all__ = ["DEVICE_TABLE"]
