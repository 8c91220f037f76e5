"""Which strategy family the package refuses on which device type, and why: one decision for the code and the pages.

The strategies refuse before any process starts (``check_collectives`` of every multi-process
family, the DeepSpeed family's ``deepspeed_accelerator``); the documentation's device pages, its
support grid and its migration page ask :func:`refusal` for the same decision, so that a page can
not offer what the code refuses. The decisions read the device table (a collective backend, the
device types DeepSpeed runs on: :func:`~lightning_anyaccel.strategies.deepspeed_checks.deepspeed_device_types`).

Example:
    >>> from lightning_anyaccel.device.devices import DEVICE_TABLE
    >>> refusal("ddp", DEVICE_TABLE["cuda"]) is None
    True
    >>> refusal("fsdp", DEVICE_TABLE["mps"])
    'Apple GPU (MPS) has no collective backend: one device per machine'
"""

from __future__ import annotations

from lightning_anyaccel.device.spec import DeviceSpec

#: The strategy families that start several processes (every family but ``single``).
MULTI_PROCESS_FAMILIES = ("ddp", "fsdp", "model_parallel", "deepspeed")

#: The support grid's strategy columns (a validation record's features) -> the family that trains them.
FEATURE_FAMILIES = {"ddp": "ddp", "fsdp": "fsdp", "fsdp2": "model_parallel", "deepspeed": "deepspeed"}


def has_collectives(spec: DeviceSpec) -> bool:
    """Whether several processes can train together on the device type (the device table names a backend)."""
    return spec.backend is not None


def refusal(family: str, spec: DeviceSpec) -> str | None:
    """Why the package refuses the strategy ``family`` on ``spec``'s device type, in a few words; ``None`` where it runs.

    ``family`` is a name of :data:`~lightning_anyaccel.strategies.families.FAMILIES` (``"ddp"``, ``"fsdp"``,
    ``"model_parallel"``, ``"deepspeed"``, ``"single"``).

    Raises:
        ValueError: an unknown family name.
    """
    if family not in (*MULTI_PROCESS_FAMILIES, "single"):
        raise ValueError(f"unknown strategy family {family!r}: one of {', '.join((*MULTI_PROCESS_FAMILIES, 'single'))}")
    if family in MULTI_PROCESS_FAMILIES and not has_collectives(spec):
        return f"{spec.name} has no collective backend: one device per machine"
    if family == "deepspeed":
        from lightning_anyaccel.strategies.deepspeed_checks import deepspeed_device_types  # imports the steps

        runs_on = deepspeed_device_types()
        if spec.type not in runs_on:
            return f"DeepSpeed runs on {', '.join(runs_on)} only"
    return None


__all__ = ["FEATURE_FAMILIES", "MULTI_PROCESS_FAMILIES", "has_collectives", "refusal"]
