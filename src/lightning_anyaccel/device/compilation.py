"""``torch.compile`` on any device: Inductor where it has a code generator, a backend that works elsewhere.

``torch.compile``'s default backend, Inductor, generates code only for the device types that
registered a code generator with it (CPU, CUDA, XPU, MPS, and vendors that ship one). On any
other device the first step fails deep inside Inductor (``InductorError: KeyError: 'npu'`` or
``LoweringException: AssertionError``), while ``backend="aot_eager"`` (AOTAutograd, no code
generation) and ``backend="eager"`` (graph capture only) run everywhere.

- :func:`compile` is ``torch.compile`` that picks ``inductor`` where :func:`inductor_supports`
  the device type and ``aot_eager`` elsewhere (said in the log); ``fallback=False`` raises
  instead, and a ``backend`` you pass is used as given (refused up front if it is Inductor on a
  device Inductor cannot compile for).
- The package's Trainer strategies check a model compiled with plain ``torch.compile`` (the
  LightningModule, or a submodule) when they set up: on a device without an Inductor code
  generator, each compiled part is tried on a tiny input first, and a failure is reported
  before training starts, with the backends that work (:func:`check_compiled`).

Example:
    >>> model = compile(torch.nn.Linear(2, 2), device_type="cpu", backend="eager")
    >>> type(model).__name__
    'OptimizedModule'
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from lightning_anyaccel import _lightning
from lightning_anyaccel.troubleshooting import LinkedError

log = logging.getLogger(__name__)

#: The ``torch.compile`` backends that need no device code generator (they run on every device).
PORTABLE_BACKENDS = ("aot_eager", "eager")


class CompileNotSupportedError(LinkedError, RuntimeError):
    """``torch.compile`` cannot compile for the device with the chosen backend."""


def inductor_supports(device_type: str) -> bool:
    """Whether Inductor (``torch.compile``'s default backend) has a code generator for ``device_type``.

    Asked from Inductor's own registry of device code generators (vendors register theirs when
    their torch package is imported). Imports Inductor (seconds) on the first call.
    """
    return _lightning.inductor_schedules(device_type)


def _unsupported(device_type: str, what: str) -> str:
    return (
        f"{what}: torch.compile's default backend, Inductor, has no code generator for {device_type!r}, so"
        f" compiling fails at the first step. Compile with backend='aot_eager' (or 'eager'), e.g."
        f" torch.compile(model, backend='aot_eager') or lightning_anyaccel.compile(model), which picks a backend"
        f" that works on the device (docs/limitations.md)."
    )


def compile(  # noqa: A001 - the name users know from torch.compile
    module: Any,
    *,
    device_type: str | None = None,
    backend: str | Callable | None = None,
    fallback: bool = True,
    **kwargs: Any,
) -> Any:
    """``torch.compile(module, backend=...)`` with a backend that compiles for ``device_type``.

    Args:
        module: the module (or function) to compile.
        device_type: where it will run; default: the device ``torch.accelerator`` reports, else CPU.
        backend: a ``torch.compile`` backend to use as given; ``None`` chooses ``"inductor"`` where
            :func:`inductor_supports` the device type, else ``"aot_eager"`` (logged).
        fallback: ``False`` raises instead of choosing ``"aot_eager"``.
        kwargs: passed to ``torch.compile`` (``mode``, ``fullgraph``, ``dynamic``, ...).

    Raises:
        CompileNotSupportedError: ``backend="inductor"`` (or ``None`` with ``fallback=False``) on a
            device Inductor cannot compile for.
    """
    if device_type is None:
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device_type = accelerator.type if accelerator is not None else "cpu"
    if backend in (None, "inductor") and not inductor_supports(device_type):
        if backend == "inductor" or not fallback:
            raise CompileNotSupportedError(_unsupported(device_type, "lightning_anyaccel.compile"))
        log.warning("torch.compile: Inductor has no code generator for %r; compiling with backend='aot_eager'.",
                    device_type)
        backend = "aot_eager"
    return torch.compile(module, backend=backend or "inductor", **kwargs)


def compiled_parts(module: torch.nn.Module) -> Iterator[tuple[str, Callable]]:
    """``(name, compile context)`` of every part of ``module`` compiled with ``torch.compile``.

    The parts are compiled submodules (``torch.compile(self.block)``) and, for a LightningModule
    given to the Trainer as ``torch.compile(model)``, the module itself (Lightning keeps the
    compile context in the module's ``_compiler_ctx``).
    """
    context = _lightning.compiler_context(module)
    if isinstance(context, dict) and context.get("dynamo_ctx") is not None:
        yield type(module).__name__, context["dynamo_ctx"]
    for name, submodule in module.named_modules():
        dynamo_ctx = getattr(submodule, "dynamo_ctx", None)
        if dynamo_ctx is not None and type(submodule).__name__ == "OptimizedModule":
            yield name or type(module).__name__, dynamo_ctx


def check_compiled(module: torch.nn.Module, device: torch.device) -> None:
    """Refuse, before training, a compiled part of ``module`` whose backend cannot compile for ``device``.

    Only where Inductor has no code generator for the device: each compiled part's context
    compiles a one-line function on a 2-element tensor on the device (the same backend the user
    chose; ``aot_eager``/``eager`` pass in a moment).

    Raises:
        CompileNotSupportedError: naming the compiled part and the backends that work.
    """
    parts = list(compiled_parts(module))
    if not parts or inductor_supports(device.type):  # Inductor is imported only for a compiled model
        return
    for name, dynamo_ctx in parts:
        try:
            dynamo_ctx(_probe)(torch.ones(2, device=device))
        except Exception as error:  # Inductor raises many types (InductorError, LoweringException, KeyError)
            raise CompileNotSupportedError(_unsupported(device.type, f"{name} was compiled with torch.compile")) from error


def _probe(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


__all__ = ["PORTABLE_BACKENDS", "CompileNotSupportedError", "check_compiled", "compile", "compiled_parts",
           "inductor_supports"]
