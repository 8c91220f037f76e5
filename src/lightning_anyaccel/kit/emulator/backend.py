"""What makes the compiled backend serve a device type: device checks, lesser-backend options, attention, collectives."""

from __future__ import annotations

from typing import Any

import torch

from lightning_anyaccel.kit.emulator.names import DEFAULT_MEMORY_BYTES, backend_name

#: The Python kernels registered here; kept alive for the life of the process.
_libraries: list[torch.library.Library] = []


def _activate(ext: Any, device_type: str, devices: int, memory_bytes: int | None) -> None:
    """The C++ backend serves ``device_type`` with ``devices`` devices of ``memory_bytes`` each, checking
    devices as torch's own kernels do (:func:`_unchecked_operators`)."""
    ext.activate(device_type)
    ext.set_device_count(devices)
    ext.set_memory_bytes(DEFAULT_MEMORY_BYTES if memory_bytes is None else memory_bytes)
    unchecked = _unchecked_operators()
    if unchecked is not None:
        ext.set_unchecked_operators(unchecked)


def _unchecked_operators() -> list[str] | None:
    """The operators marked ``device_check: NoCheck`` in the ``native_functions.yaml`` torch ships (in
    ``torchgen``): their kernels check devices themselves (CPU scalars pass), every other kernel refuses
    arguments on two devices. ``None`` where torch ships no such file (every operator is then checked as
    TensorIterator checks)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("torchgen")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    files = [Path(p) / "packaged" / "ATen" / "native" / "native_functions.yaml" for p in locations]
    path = next((f for f in files if f.is_file()), None)
    if path is None:
        return None
    names, current = [], ""
    for line in path.read_text().splitlines():  # a line scan: parsing the YAML takes a second per process
        if line.startswith("- func:"):
            current = line[len("- func:"):].strip().split("(", 1)[0]
        elif current and line.strip().startswith("device_check:") and "NoCheck" in line:
            names.append(current)
    return names


def _refuse_shallow_copies() -> None:
    """``noshallow``: the kernel out-of-tree backends without shallow-copy support answer with."""
    import warnings

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        library.impl("_has_compatible_shallow_copy_type", lambda self, src: False, "PrivateUse1")
    _libraries.append(library)


def _attention_on_the_math_backend(name: str) -> None:
    """``scaled_dot_product_attention`` on its math backend (matmul, softmax: the device's CPU kernels).

    torch's attention asks the backend which kernel to use. For ``hpu`` (and PrivateUse1 names) it
    asks the operator ``aten::_fused_sdp_choice``, which the CPU fallback would answer by running
    the CPU choice on CPU views of the tensors; under ``torch.compile`` the tensors are fake, have
    no memory to view, and tracing failed ("Cannot access data pointer of Tensor"). Real backends
    answer from the tensors' metadata; the emulator answers "math" without reading them. For ``xpu``
    torch asks a dispatch stub directly, whose XPU slot a CPU build of torch lacks ("An unexpected
    device type was provided xpu"): there the operator itself gets an ``AutogradXPU`` kernel, the
    composite math implementation (differentiable through its parts), as torch runs it for the
    other names. See docs/emulator.md.
    """
    import warnings

    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torch with a PrivateUse1 answer of its own: the emulator's replaces it
        library.impl("_fused_sdp_choice", _math_choice, {"xpu": "XPU", "hpu": "HPU"}.get(name, "PrivateUse1"))
    if name == "xpu":
        library.impl("scaled_dot_product_attention", _attention_math, "AutogradXPU")
    _libraries.append(library)


def _math_choice(*args: Any, **kwargs: Any) -> int:
    from torch.nn.attention import SDPBackend

    return int(SDPBackend.MATH.value)


def _attention_math(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                    enable_gqa: bool = False) -> torch.Tensor:
    """What torch's ``scaled_dot_product_attention`` runs for the math backend: a boolean mask made additive."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(attn_mask.logical_not(), float("-inf"))
    return torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]



def _register_collectives(name: str, avg: bool = True) -> None:
    """Register ``backend_name(name)`` for the device type, as vendors register hccl/cncl/...

    ``avg=False`` (option ``noavg``): its groups refuse ``ReduceOp.AVG``.
    """
    import torch.distributed as dist

    if not dist.is_available():
        return
    from lightning_anyaccel.kit.emulator.collectives import make_creator

    backend = backend_name(name)
    if backend == "xccl":
        _stand_in_process_group_xccl()
    elif backend.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(backend, make_creator(name, backend, avg=avg), devices=[name])


def _stand_in_process_group_xccl() -> None:
    """``xccl`` is built into torch: ``init_process_group`` creates it itself, from the binding
    ``torch._C._distributed_c10d.ProcessGroupXCCL``, before it looks at registered backends, so
    ``Backend.register_backend("xccl", ...)`` can never be reached. A CPU build lacks that binding
    (``torch.distributed.distributed_c10d`` then sets ``_XCCL_AVAILABLE = False`` at import, which
    happens inside ``import torch``, before any emulator code can run). The stand-in is the binding:
    a ``ProcessGroupXCCL`` with ``Options`` that creates the emulator's process group, set where
    torch's import would have put it, with ``_XCCL_AVAILABLE``."""
    from torch.distributed import distributed_c10d as c10d

    from lightning_anyaccel.kit.emulator.collectives import make_creator

    create = make_creator("xpu", "xccl")

    class ProcessGroupXCCL:
        """Stand-in of torch's XCCL binding on the emulated xpu (collectives staged through gloo)."""

        class Options:
            def __init__(self) -> None:
                self.global_ranks_in_group: list[int] = []
                self.group_name = ""
                self._timeout: Any = None

        def __new__(cls, store: Any, rank: int, size: int, options: Any) -> Any:
            return create(store, rank, size, options._timeout)

    setattr(c10d, "ProcessGroupXCCL", ProcessGroupXCCL)  # noqa: B010 (torch's stubs declare the binding's type)
    c10d._XCCL_AVAILABLE = True

