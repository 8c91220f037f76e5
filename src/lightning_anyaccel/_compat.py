"""The PyTorch floor, checked at import with a message instead of a pip upgrade.

torch >= 2.8 because the package calls ``torch.accelerator.memory_stats`` /
``empty_cache`` / ``set_device_index`` (2.8), ``torch.get_device_module`` (2.3),
``torch.amp.is_autocast_available`` and ``torch.get_autocast_dtype`` (2.4), and stock XPU
builds ship the ``xccl`` backend from 2.8 on.
"""

from __future__ import annotations

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
