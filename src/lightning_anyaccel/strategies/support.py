"""Whether a device type can run several processes, and whether DeepSpeed runs on it: the rules the strategies refuse with.

The multi-process strategies refuse before any process starts: ``check_collectives`` of every
multi-process family where :func:`has_collectives` says no, the DeepSpeed family's
``check_deepspeed_support`` where :func:`deepspeed_support` does. The decisions read the device
table (a collective backend) and DeepSpeed's own accelerator list and probe. The family table
(:func:`lightning_anyaccel.strategies.families.refusal`) combines them per family for the
documentation's device pages, support grid and migration page, so that a page can not offer what
the code refuses.

Example:
    >>> from lightning_anyaccel.device.devices import DEVICE_TABLE
    >>> has_collectives(DEVICE_TABLE["cuda"]), has_collectives(DEVICE_TABLE["mps"])
    (True, False)
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path
from typing import NamedTuple

from lightning_anyaccel import _lightning
from lightning_anyaccel.device.spec import DeviceSpec


class DeepSpeedSupport(NamedTuple):
    """The answer of :func:`deepspeed_support`: whether DeepSpeed trains on a device type, and why not."""

    #: DeepSpeed trains on the device type (``probe=False``: DeepSpeed has an accelerator for it).
    supported: bool
    #: Why not, naming what to install or use instead; where supported, what DeepSpeed's accelerator
    #: needs (``"needs torch_sdaa"``), else ``""``.
    reason: str


#: The strategies that shard on every device type, named where DeepSpeed does not run.
_INSTEAD = "Use strategy='any_fsdp' or 'any_fsdp2', which need nothing beyond torch."


def deepspeed_accelerators() -> tuple[str, ...]:
    """DeepSpeed's accelerator names (its ``SUPPORTED_ACCELERATOR_LIST``), read from the installed DeepSpeed.

    Read from the source, not imported: importing DeepSpeed makes it choose its accelerator for the
    process. Empty when DeepSpeed is not installed.

    >>> {"cuda", "cpu", "npu", "sdaa", "mlu"} <= set(deepspeed_accelerators())
    True
    """
    return _accelerator_list()


@functools.cache
def _accelerator_list() -> tuple[str, ...]:
    try:
        found = importlib.util.find_spec("deepspeed")
    except ValueError:
        found = None
    if found is None or found.origin is None:
        return ()
    source = Path(found.origin).parent / "accelerator" / "real_accelerator.py"
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SUPPORTED_ACCELERATOR_LIST"
                                                for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{source} no longer defines SUPPORTED_ACCELERATOR_LIST: update deepspeed_accelerators().")


def deepspeed_support(spec: DeviceSpec, *, probe: bool = True) -> DeepSpeedSupport:
    """Whether DeepSpeed trains on ``spec``'s device type: the one rule the strategies, the tools and the pages ask.

    DeepSpeed runs on a device type when its accelerator list has an accelerator of that name and,
    with ``probe``, when DeepSpeed's own probe for it passes in this process (``DS_ACCELERATOR``
    set to the name: the vendor package its accelerator imports, ``torch_npu``, ``torch_sdaa``,
    ``torch_mlu``, ``habana_frameworks.torch.hpu``, is importable). ``probe=False`` answers what
    the installed DeepSpeed offers anywhere (the documentation's question), without importing it.

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> deepspeed_support(get_spec("cpu"))
    DeepSpeedSupport(supported=True, reason='')
    >>> deepspeed_support(get_spec("sdaa"), probe=False)
    DeepSpeedSupport(supported=True, reason='needs torch_sdaa')
    >>> deepspeed_support(get_spec("musa"), probe=False).reason.startswith("DeepSpeed has no accelerator for 'musa'")
    True
    """
    device_type = spec.type
    names = deepspeed_accelerators()
    if not names:
        return DeepSpeedSupport(False, "DeepSpeed is not installed: `pip install lightning-anyaccel[deepspeed]`"
                                       " (on machines without a CUDA toolkit: `DS_BUILD_OPS=0 pip install deepspeed`).")
    if device_type not in names:
        return DeepSpeedSupport(False, f"DeepSpeed has no accelerator for {device_type!r} (it has: {', '.join(names)})."
                                       f" {_INSTEAD}")
    if not probe:
        return DeepSpeedSupport(True, f"needs {spec.vendor_module}" if spec.vendor_module else "")
    failure = _probe(device_type)
    if failure is None:
        return DeepSpeedSupport(True, "")
    install = f" Install {spec.install}." if spec.install else ""
    return DeepSpeedSupport(False, f"DeepSpeed's {device_type!r} accelerator can not start here: {failure}{install}"
                                   f" {_INSTEAD}")


def _probe(name: str) -> str | None:
    """DeepSpeed's probe for its accelerator ``name`` (``DS_ACCELERATOR=name``): ``None``, or its message."""
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = name
    try:
        return _lightning.probe_deepspeed_accelerator()
    finally:
        if saved is None:
            del os.environ["DS_ACCELERATOR"]
        else:
            os.environ["DS_ACCELERATOR"] = saved


def has_collectives(spec: DeviceSpec) -> bool:
    """Whether several processes can train together on the device type (the device table names a backend)."""
    return spec.backend is not None


__all__ = ["DeepSpeedSupport", "deepspeed_accelerators", "deepspeed_support", "has_collectives"]
