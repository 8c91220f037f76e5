"""A runtime patch of Lightning: the hook the package installs in its out-of-memory detection, so every device's out-of-memory
error is one, not only CUDA's.

Lightning's batch-size finder (``Tuner.scale_batch_size``, the ``BatchSizeFinder`` callback) backs off
when ``lightning.pytorch.utilities.memory.is_oom_error`` says a step ran out of memory, and that asks
``is_cuda_out_of_memory``, which wants "CUDA" in the message: an XPU, HPU or NPU out-of-memory error
stopped the finder instead. The hook makes ``is_cuda_out_of_memory`` also answer yes for what
``is_out_of_memory`` (``lightning_anyaccel.device.runtime.is_out_of_memory``) recognises;
``is_oom_error`` looks the name up in its module at each call, so every caller sees it.

Part of the contract (:mod:`lightning_anyaccel._lightning`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_anyaccel._lightning.connector_patches import replace_function
from lightning_anyaccel._lightning.porting import Distribution

#: Lightning's CUDA out-of-memory test, which ``is_oom_error`` asks (module as in ``lightning``).
_OUT_OF_MEMORY = ("lightning.pytorch.utilities.memory", "is_cuda_out_of_memory")


def install_out_of_memory_hook(distribution: Distribution, is_out_of_memory: Callable[[BaseException], bool]) -> None:
    """Let Lightning's out-of-memory detection of ``distribution``'s Trainer recognise ``is_out_of_memory``'s errors
    too (idempotent). Lightning's own answers are kept."""
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def is_cuda_out_of_memory(exception: BaseException) -> bool:
            return bool(original(exception)) or is_out_of_memory(exception)

        return is_cuda_out_of_memory

    replace_function(distribution, _OUT_OF_MEMORY, wrap)


__all__ = ["install_out_of_memory_hook"]
