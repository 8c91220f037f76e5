"""What this torch offers: the version floor, checked at import, and feature detection above it.

**The floor, torch >= 2.8.** Stock XPU wheels ship the ``xccl`` collective backend from 2.8 on
(multi-device training on Intel GPUs needs it), and everything the package calls unconditionally is
older: ``torch.accelerator`` with ``current_accelerator(check_available=...)``,
``set_device_index`` / ``current_device_index`` (2.6/2.7), ``torch.get_device_module``,
``torch.amp.is_autocast_available``, ``torch.get_autocast_dtype``, the public
``torch.distributed.fsdp.fully_shard`` (2.6).

**Above the floor, detected, never assumed.** Newer device-generic APIs are looked up when they are
called (so tests can fake their presence and absence) and preferred where present; without them
the package uses the device module (``torch.xpu``, ``torch_npu``'s ``torch.npu``, ...):

- ``torch.accelerator.memory_stats`` / ``empty_cache`` (memory through ``torch.accelerator``, not in
  the 2.7/2.8 API listings);
- ``torch.accelerator.random.manual_seed_all`` (accelerator RNG, proposed in 2026 for 2.14+);
- ``torch.accelerator.set_device_index`` (the device module's ``set_device`` where the accelerator
  API does not speak for the device type).

:func:`torch_features` lists what this torch has (``python -m lightning_anyaccel.verify`` shows
the versions; docs/installation.md the vendor stacks and their torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

MIN_TORCH = (2, 8)


def check_torch(version: str = torch.__version__) -> None:
    """Raise ``ImportError`` naming the fix when ``version`` is older than :data:`MIN_TORCH`.

    >>> check_torch("2.13.0+cpu")
    >>> check_torch("2.7.1+xpu")
    Traceback (most recent call last):
    ...
    ImportError: lightning-anyaccel needs torch >= 2.8, found 2.7.1+xpu. Install a newer build of your vendor's torch (the package never upgrades torch for you).
    """
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    if parts < MIN_TORCH:
        raise ImportError(
            f"lightning-anyaccel needs torch >= {'.'.join(map(str, MIN_TORCH))}, found {version}."
            " Install a newer build of your vendor's torch (the package never upgrades torch for you)."
        )


def accelerator_function(*names: str) -> Callable[..., Any] | None:
    """The first of ``torch.accelerator.<name>`` that this torch has, else ``None``.

    Names go newest first, e.g. ``accelerator_function("memory_stats")``.
    Looked up on every call, never cached.

    >>> accelerator_function("no_such_api") is None
    True
    >>> accelerator_function("device_count") is torch.accelerator.device_count
    True
    """
    for name in names:
        fn = getattr(torch.accelerator, name, None)
        if callable(fn):
            return fn
    return None


def accelerator_random() -> Any | None:
    """``torch.accelerator.random`` (device-generic RNG) when this torch has it, else ``None``."""
    module = getattr(torch.accelerator, "random", None)
    if module is None:
        try:
            module = importlib.import_module("torch.accelerator.random")
        except ImportError:
            return None
    return module if callable(getattr(module, "manual_seed_all", None)) else None


def current_accelerator() -> torch.device | None:
    """The accelerator PyTorch was built for *and* can use now, else ``None``.

    Uses ``current_accelerator(check_available=True)``, which does not poison ``fork`` (PyTorch
    documents the check as fork-safe).
    """
    return torch.accelerator.current_accelerator(check_available=True)


def torch_features() -> dict[str, bool]:
    """Which detected APIs this torch has (``True``: the package uses it; ``False``: the fallback).

    >>> sorted(torch_features())
    ['accelerator.current_accelerator(check_available)', 'accelerator.empty_cache', 'accelerator.memory_stats', 'accelerator.random', 'accelerator.set_device_index']
    """
    try:
        torch.accelerator.current_accelerator(check_available=False)
        check_available = True
    except TypeError:
        check_available = False
    return {
        "accelerator.current_accelerator(check_available)": check_available,
        "accelerator.memory_stats": accelerator_function("memory_stats") is not None,
        "accelerator.empty_cache": accelerator_function("empty_cache") is not None,
        "accelerator.set_device_index": accelerator_function("set_device_index") is not None,
        "accelerator.random": accelerator_random() is not None,
    }
