"""Collective backend choice, means without ``ReduceOp.AVG``, and fork safety, for every device type.

Lightning takes the backend from ``torch.distributed.Backend.default_device_backend_map`` and
falls back to ``gloo``: HPU then gets ``fake`` (a testing backend registered by torch's FSDP
imports), and PrivateUse1 devices whose vendor did not register a mapping get ``gloo``, which
cannot move their tensors. :func:`resolve_backend` never does either.

Example:
    >>> import torch
    >>> resolve_backend(torch.device("cpu"))
    'gloo'
    >>> resolve_backend(torch.device("cpu"), explicit="gloo")
    'gloo'
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_anyaccel import _lightning
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import NOT_REAL_BACKENDS, derive_backend, get_spec
from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.troubleshooting import LinkedError

log = logging.getLogger(__name__)

#: Marks a backend creator that :func:`adopt_whole_group_backend` already wrapped.
_ADOPTED = "__lightning_anyaccel_adopted__"


class BackendError(LinkedError, RuntimeError):
    """No usable collective backend for the device."""


def resolve_backend(device: torch.device, explicit: str | None = None) -> str:
    """The ``torch.distributed`` backend for collectives on ``device``.

    Order: an explicit ``process_group_backend=`` wins, if torch says it carries the device's
    tensors; then the backend the device's vendor registered for this device type
    (``Backend.register_backend(..., devices=[...])``); then the device spec's backend.
    ``fake``/``undefined`` are never returned, and there is no silent fallback to ``gloo``. A query:
    it imports the vendor's modules the device spec names (they register the backend) and changes
    nothing in torch; :func:`prepare_backend` is what a process runs before it creates its group.

    Raises:
        BackendError: no backend for the device (it supports one device only), a backend that can
            not carry its tensors, or one not registered in this process, each naming the fix.
    """
    return spec_backend(get_spec(device.type), explicit)


def spec_backend(spec: DeviceSpec, explicit: str | None = None) -> str:
    """:func:`resolve_backend` for a device type whose spec the caller holds.

    >>> from lightning_anyaccel.device.devices import get_spec
    >>> spec_backend(get_spec("cpu"))
    'gloo'
    """
    device_type = spec.type
    name: str | None
    if explicit:
        name = explicit.lower()
    else:
        mapped = dist.Backend.default_device_backend_map.get(device_type)
        carries = device_type in dist.Backend.backend_capability.get(mapped or "", [device_type])
        name = mapped if mapped and mapped not in NOT_REAL_BACKENDS and carries else spec.backend
        if spec.backend is None and name is None:
            raise BackendError(
                f"{spec.name} has no collective backend for {device_type!r} in this PyTorch, so it supports one"
                " device only: use devices=1 (strategy='any_single'). For several devices, the vendor's package"
                " must register its backend for the device type, as torch's API for it does:"
                f" `torch.distributed.Backend.register_backend(NAME, create_fn, devices=[{device_type!r}])`."
            )
    assert name is not None
    if name in NOT_REAL_BACKENDS:
        raise BackendError(
            f"process_group_backend={name!r} is a test stub that does no real communication."
            f" Use {spec.backend!r} for {spec.name}."
        )
    for module in (spec.vendor_module, spec.backend_module):
        if module:
            _try_import(module)
    if not dist.is_backend_available(name):
        registers = spec.backend_module or spec.vendor_module
        hint = f"install {spec.install}" + (f" and `import {registers}`" if registers else "")
        raise BackendError(
            f"The collective backend {name!r} for {spec.name} ({device_type!r}) is not registered in this"
            f" PyTorch (registered: {', '.join(sorted(set(dist.Backend.backend_list) - NOT_REAL_BACKENDS))})."
            f" To fix: {hint}, or pass a registered one with `AnyDDPStrategy(process_group_backend=...)`."
        )
    carried = dist.Backend.backend_capability.get(name)
    if explicit and carried is not None and device_type not in carried:
        own = derive_backend(device_type) or spec.backend
        raise BackendError(
            f"process_group_backend={name!r} can not carry {spec.name} ({device_type!r}) tensors: torch registered"
            f" it for {', '.join(carried)} only. "
            + (f"Pass process_group_backend={own!r}, or none (the package picks it)." if own and own != name else
               f"{spec.name} has no collective backend in this PyTorch: use devices=1, or register the vendor's"
               f" backend with `torch.distributed.Backend.register_backend(NAME, create_fn, devices=[{device_type!r}])`.")
        )
    return name


def prepare_backend(device: torch.device, explicit: str | None = None) -> str:
    """The backend for ``device`` (:func:`resolve_backend`), made ready for ``init_process_group``.

    The one place the package changes torch's backend registry: a vendor backend whose creator
    returns a whole process group is wrapped (:func:`adopt_whole_group_backend`). The strategies'
    setup runs it as the step ``prepare_backend``; scripts that create their own group call it
    before ``torch.distributed.init_process_group``.
    """
    name = resolve_backend(device, explicit)
    adopt_whole_group_backend(name)
    return name


def adopt_whole_group_backend(name: str) -> None:
    """Let a registered backend whose creator returns a whole ``ProcessGroup`` work on torch >= 2.15.

    Vendors register a backend with ``Backend.register_backend(name, creator, devices=[...])``. When
    the creator returns a ``c10d.Backend``, torch registers it on the group it builds and names it the
    group's default. When the creator returns a ``ProcessGroup`` subclass of its own (a Python
    process group), torch uses that group as it is; torch 2.15 then attaches its flight recorder to
    it, which looks the group up through its default backend and fails with "Could not find the
    default backend type 0 for Process Group" unless the creator called ``_set_default_backend``
    (docs/limitations.md). This wraps such a creator once: a group it returns that registered
    exactly one backend type gets that type as its default, as torch does for the groups it builds;
    a group with several types is left as it is. Backends built into torch are not touched.
    """
    plugins = _lightning.backend_creators()
    plugin = plugins.get(name.upper())
    if plugin is None or getattr(plugin.creator_fn, _ADOPTED, False):
        return
    creator: Callable[..., Any] = plugin.creator_fn

    @functools.wraps(creator)
    def create(*args: Any, **kwargs: Any) -> Any:
        group = creator(*args, **kwargs)
        if isinstance(group, dist.ProcessGroup):
            _name_the_default_backend(group, name)
        return group

    setattr(create, _ADOPTED, True)
    plugins[name.upper()] = type(plugin)(creator_fn=create, extended_api=plugin.extended_api)


def _name_the_default_backend(group: dist.ProcessGroup, name: str) -> None:
    """Make the one backend type ``group`` registered its default (see :func:`adopt_whole_group_backend`)."""
    registered = []
    for backend_type in dist.ProcessGroup.BackendType.__members__.values():
        if _lightning.has_backend_type(group, backend_type):
            registered.append(backend_type)
    if len(registered) != 1:
        log.debug("lightning-anyaccel: backend %r returned a process group with backend types %s; its default"
                  " backend is left as the vendor set it", name, registered)
        return
    _lightning.set_default_backend(group, registered[0])
    log.debug("lightning-anyaccel: backend %r returned its own process group: its %s backend is the group's default",
              name, registered[0])


def _try_import(module: str) -> None:
    """Import a vendor module if it is installed; its absence is reported by the caller."""
    try:
        importlib.import_module(module)
    except ImportError:
        return


def is_mean(reduce_op: Any) -> bool:
    """Whether a Lightning ``reduce_op`` asks for a mean: ``"mean"``/``"avg"`` (any case) or ``ReduceOp.AVG``.

    >>> is_mean("mean"), is_mean("AVG"), is_mean("sum"), is_mean(None)
    (True, True, False, False)
    """
    if isinstance(reduce_op, str):
        return reduce_op.lower() in ("mean", "avg")
    return reduce_op is not None and dist.is_available() and reduce_op == dist.ReduceOp.AVG


def reduce_mean_as_sum(reduce: Callable[[Any, Any, Any], Any], tensor: Any, group: Any, reduce_op: Any) -> Any:
    """Lightning's ``reduce(tensor, group, reduce_op)``, with a mean reduced as a sum divided by the group's size.

    Lightning reduces a mean (``self.log(..., sync_dist=True)``, ``strategy.reduce``,
    ``fabric.all_reduce``) with ``ReduceOp.AVG`` on every backend but gloo; some vendors'
    collective libraries refuse ``AVG``, on some paths only (oneCCL: intel/torch-xpu-ops#2361),
    so a probe could not tell. This sums (every backend has ``SUM``) and divides in place, as
    Lightning does on gloo: integers are divided and truncated, as there. Anything that is not a
    mean, and anything outside an initialised process group, goes to ``reduce`` unchanged.
    """
    if not (isinstance(tensor, torch.Tensor) and is_mean(reduce_op) and dist.is_available() and dist.is_initialized()):
        return reduce(tensor, group, reduce_op)
    total = reduce(tensor, group, "sum")
    size = dist.get_world_size(group)
    return total.div_(size) if torch.is_floating_point(total) else total.copy_(total / size)


class ForkAfterInitError(LinkedError, RuntimeError):
    """Forking now would give the children a device they cannot use."""


def check_fork_safe(device_type: str) -> None:
    """Refuse to ``fork`` when this process already initialised ``device_type``.

    Children of such a fork fail opaquely ("Cannot re-initialize XPU in forked subprocess");
    this raises first, naming the start methods that work.

    >>> check_fork_safe("cpu")
    """
    spec = get_spec(device_type)
    if spec.fork_safe_after_init or not runtime.is_initialized(spec):
        return
    raise ForkAfterInitError(
        f"{spec.name} was already initialised in this process, so forked workers cannot use it."
        " Use strategy='any_ddp' (popen: run your code as a script) or 'any_ddp_spawn',"
        " or restart the kernel and do not touch the device before `fit` when using 'any_ddp_notebook'/'any_ddp_fork'."
    )
