"""What ``torch.profiler`` records on a device type: the host and the device's own activity.

The device's activity is the device table's ``profiler_activity`` (``XPU``, ``HPU``, ``PrivateUse1``,
...), recorded where this process's torch can record it (``torch.profiler.supported_activities()``: a
vendor's torch registers it; for a PrivateUse1 backend, an activity profiler registered with torch).
Where it can not, the profiler records the host only and :func:`profiler_plan` says so in one line.

Example (a Fabric or plain PyTorch loop; on the emulated ``npu`` the activities are ``CPU`` and ``NPU``)::

    from lightning_anyaccel import profiler_activities, profiler_sort_key

    with torch.profiler.profile(activities=profiler_activities(fabric.device)) as prof:
        train_a_few_steps()
    print(prof.key_averages().table(sort_by=profiler_sort_key(fabric.device), row_limit=10))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_anyaccel import _lightning
from lightning_anyaccel.device.devices import get_spec

#: What the report is sorted by where the device's time is recorded (torch's name for every device).
DEVICE_SORT_KEY = "device_time_total"
#: ... and where only the host's is.
HOST_SORT_KEY = "cpu_time_total"


@dataclass(frozen=True)
class ProfilerPlan:
    """What the profiler records for one device type, and the line that says what it can not."""

    activities: list[torch.profiler.ProfilerActivity]
    sort_key: str
    #: ``None``, or why the device's own activity is not recorded (one line for the log).
    host_only_reason: str | None = None


def profiler_plan(device_type: str) -> ProfilerPlan:
    """The activities and sort key for profiling on ``device_type`` (see :func:`profiler_activities`)."""
    activity = torch.profiler.ProfilerActivity
    spec = get_spec(device_type)
    if spec.host or not spec.profiler_activity:
        return ProfilerPlan([activity.CPU], HOST_SORT_KEY)
    device = getattr(activity, spec.profiler_activity, None)
    supported = torch.profiler.supported_activities()
    recorded = device in supported
    if device is activity.PrivateUse1 and recorded:  # listed for every renamed backend: ask who records it
        recorded = _lightning.privateuse1_profiler_registered() is True  # None: a torch without the registry
    if device is None or not recorded:
        reason = (f"lightning-anyaccel: this torch records no {device_type} activity (its backend registered no"
                  " activity profiler with torch.profiler); the profiler reports host time only.")
        return ProfilerPlan([activity.CPU], HOST_SORT_KEY, reason)
    return ProfilerPlan([activity.CPU, device], DEVICE_SORT_KEY)


def profiler_activities(device: str | torch.device) -> list[torch.profiler.ProfilerActivity]:
    """``torch.profiler.profile(activities=...)`` for ``device``: the host and, where this torch records it,
    the device's own activity (for Fabric and plain PyTorch loops; the Trainer's ``profiler="pytorch"``
    gets it by itself)."""
    return profiler_plan(torch.device(device).type).activities


def profiler_sort_key(device: str | torch.device) -> str:
    """``key_averages().table(sort_by=...)`` for ``device``: the device's time where it is recorded, else the host's."""
    return profiler_plan(torch.device(device).type).sort_key


__all__ = ["DEVICE_SORT_KEY", "HOST_SORT_KEY", "ProfilerPlan", "profiler_activities", "profiler_plan",
           "profiler_sort_key"]
