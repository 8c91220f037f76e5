"""What Lightning's automatic choice (``accelerator="auto"``, the default) picks once the package is imported.

Lightning's own choice tries TPU, MPS, CUDA, then the CPU; it never looks at the device torch
reports (``torch.accelerator``), so an XPU, Gaudi or Ascend machine trains on the CPU. With the
package imported, ``Trainer()``, ``Trainer(accelerator="auto")``, ``Fabric()`` and
``Fabric(accelerator="auto")`` take that device instead, with the package's accelerator:

- Lightning chose TPU, MPS or CUDA: **kept**, unchanged (Lightning's own accelerator classes);
- torch reports no accelerator, or one Lightning has its own accelerator for: **kept**
  (Lightning's ``CPUAccelerator`` on a plain machine);
- torch reports another device type (``xpu``, ``hpu``, a PrivateUse1 device such as ``npu``, a
  type in no table): ``AnyAccelerator(<type>)``, as ``accelerator="any"`` would give. Then
  ``devices="auto"`` means all of them and the package's strategies train
  (:mod:`lightning_anyaccel.wiring.policy`: ``any_ddp`` for several). Said once in the log
  (:func:`found_message`);
- such a device is reported but can not be used here (no device visible, a type torch half
  knows): the CPU is kept, and the log says why.

``LIGHTNING_ANYACCEL_AUTO=lightning`` keeps Lightning's choice everywhere (:data:`AUTO_ENV`).

Example:
    >>> auto_mode({}), auto_mode({"LIGHTNING_ANYACCEL_AUTO": "lightning"})
    ('device', 'lightning')
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from lightning_anyaccel import _lightning
from lightning_anyaccel.cluster.launch_layout import detect_launcher
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec, is_host
from lightning_anyaccel.troubleshooting import LinkedError

log = logging.getLogger(__name__)

#: The environment variable that chooses what ``accelerator="auto"`` picks.
AUTO_ENV = "LIGHTNING_ANYACCEL_AUTO"
#: Its values: what each one makes ``accelerator="auto"`` pick.
AUTO_MODES: dict[str, str] = {
    "device": "the device torch reports (the default)",
    "lightning": "Lightning's own choice: TPU, MPS, CUDA, else the CPU",
}


class AutoModeError(LinkedError, ValueError):
    """``LIGHTNING_ANYACCEL_AUTO`` has a value that is not one of :data:`AUTO_MODES`."""


def auto_mode(environ: Mapping[str, str] = os.environ) -> str:
    """``"device"`` (default) or ``"lightning"``, from ``LIGHTNING_ANYACCEL_AUTO``.

    Raises:
        AutoModeError: any other value, naming the accepted ones.
    """
    value = environ.get(AUTO_ENV, "").strip().lower() or "device"
    if value not in AUTO_MODES:
        accepted = "; ".join(f"{name!r}: {meaning}" for name, meaning in AUTO_MODES.items())
        raise AutoModeError(f"{AUTO_ENV}={environ[AUTO_ENV]!r} is not an accepted value. Use one of {accepted}.")
    return value


def choose_accelerator(distribution: _lightning.Distribution, lightning_choice: str) -> Any:
    """What ``accelerator="auto"`` trains with: ``lightning_choice`` or the package's accelerator (module docstring).

    Args:
        distribution: the Lightning package of the Trainer or Fabric being built.
        lightning_choice: what Lightning chose (``"tpu"``, ``"mps"``, ``"cuda"`` or ``"cpu"``).

    Returns:
        ``lightning_choice``, or an ``AnyAccelerator`` of ``distribution`` for the device found, with
        :attr:`~lightning_anyaccel.accelerator.AnyAccelerator.found_by_auto` set.

    Raises:
        AutoModeError: a wrong ``LIGHTNING_ANYACCEL_AUTO``.
    """
    mode = auto_mode()
    if lightning_choice != "cpu":
        return lightning_choice
    device_type = _reported_device_type()
    if device_type is None:
        return lightning_choice
    if mode == "lightning":
        _say(distribution, f"{AUTO_ENV}=lightning: accelerator='auto' keeps Lightning's choice, the CPU, although"
                        f" torch reports {device_type!r} (accelerator='any' or {device_type!r} trains on it).")
        return lightning_choice
    count, reason = _usable_count(device_type)
    if not count:
        _say(distribution, f"accelerator='auto' keeps the CPU: torch reports {device_type!r}, but {reason}.", warn=True)
        return lightning_choice
    from lightning_anyaccel.accelerator import accelerator_class

    accelerator = accelerator_class(device_type, distribution)()
    accelerator.found_by_auto = count
    return accelerator


def found_message(accelerator: Any, strategy: Any, num_devices: int, num_nodes: int) -> str:
    """The log line of a Trainer or Fabric whose ``accelerator="auto"`` took the device torch reports.

    >>> class Acc: device_type, found_by_auto = "acme", 2
    >>> class AnyDDPStrategy: pass
    >>> found_message(Acc(), AnyDDPStrategy(), 2, 1)  # doctest: +ELLIPSIS
    "found 2 acme devices (ACME device): training with AnyDDPStrategy on 2 of them (LIGHTNING_ANYACCEL_AUTO=lightning: ..."
    """
    device_type = accelerator.device_type
    found = accelerator.found_by_auto
    where = f"{num_devices} of them" + (f" on each of {num_nodes} nodes" if num_nodes > 1 else "")
    return (f"found {found} {device_type} device{'s' if found != 1 else ''} ({_name(device_type)}): training with"
            f" {type(strategy).__name__} on {where} ({AUTO_ENV}=lightning: Lightning's own choice)")


def _reported_device_type() -> str | None:
    """The device type torch reports, if it is one only the package serves; ``None`` otherwise (never raises)."""
    try:
        device_type = runtime.detect_device_type()
    except Exception as err:  # noqa: BLE001 - a broken vendor install must not break a CPU user's Trainer()
        log.debug("lightning-anyaccel: no device detected: %s", err)
        return None
    if is_host(device_type):
        return None
    try:
        builtin = get_spec(device_type).lightning_builtin
    except Exception:  # noqa: BLE001 - a type torch half knows: _usable_count says why it is not used
        return device_type
    return None if builtin is not None else device_type


def _usable_count(device_type: str) -> tuple[int, str]:
    """How many ``device_type`` devices this process can use, or 0 and why not (never raises)."""
    try:
        spec = get_spec(device_type)
        if not runtime.is_available(spec):
            return 0, "its device module says it is not available"
        count = runtime.device_count(spec)
    except Exception as err:  # noqa: BLE001 - see the docstring
        return 0, f"the package can not use it ({type(err).__name__}: {err})"
    return (count, "") if count > 0 else (0, "no device of that type is visible to this process")


def _name(device_type: str) -> str:
    try:
        return get_spec(device_type).name
    except Exception:  # noqa: BLE001 - a log line must not fail
        return f"{device_type.upper()} device"


def first_process(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is rank 0 of an MPI-style launcher's job (or was started by none).

    Lightning's ``rank_zero_*`` know the rank before the strategy sets it from ``RANK``,
    ``LOCAL_RANK`` and SLURM's variable only; ``mpiexec``/``mpirun`` name it otherwise
    (:data:`lightning_anyaccel.cluster.launch_layout.LAUNCHERS`), and the automatic choice is logged while
    the Trainer or Fabric is built, before that.

    >>> first_process({"PMI_RANK": "1", "MPI_LOCALRANKID": "1"}), first_process({})
    (False, True)
    """
    launcher = detect_launcher(environ)
    return launcher is None or environ.get(launcher.rank, "0").strip() == "0"


def _say(distribution: _lightning.Distribution, message: str, warn: bool = False) -> None:
    if not first_process():
        return
    rank_zero = distribution.module("lightning.fabric.utilities.rank_zero")
    (rank_zero.rank_zero_warn if warn else rank_zero.rank_zero_info)(f"lightning-anyaccel: {message}")


__all__ = ["AUTO_ENV", "AUTO_MODES", "AutoModeError", "auto_mode", "choose_accelerator", "first_process",
           "found_message"]
