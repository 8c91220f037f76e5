r"""The first and the last cell of every tutorial notebook: the shared set-up, and the run time it measured.

``start("02_single_card")`` does what every notebook needs before it teaches anything (Lightning's info
lines and known harmless warnings off, one CPU thread, the device ``torch.accelerator`` reports), prints
the device and the versions, and shows the notebook's run time as its last measured run recorded it.
``finish()`` ends the notebook: it prints how long this run took (from the kernel's start when ``start``
was its first call, as in "Run All" in a fresh kernel) and, when
``LIGHTNING_ANYACCEL_RECORD_RUN_TIMES`` names a JSON file (``make notebook-times`` sets it to
:data:`RUN_TIMES`), writes that time there, so that the header of the next run shows it. No run time in
a notebook is written by hand.

Example::

    >>> from lightning_anyaccel.kit.tutorial.session import run_time_line
    >>> run_time_line("01_verify", {"01_verify": {"seconds": 31.6, "cpus": 2, "load": 1.2,
    ...                                           "date": "2026-11-29"}})
    'Run time: 32 s on 2 CPU cores (load average 1.2 at the end), measured when this notebook last ran to its end (2026-11-29).'
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

#: The run times ``make notebook-times`` records (part of the installed package, so that a downloaded
#: notebook shows them too).
RUN_TIMES = Path(__file__).resolve().parent / "run_times.json"
#: Names the JSON file ``finish()`` writes the measured run time into; unset, it writes nothing.
RECORD_ENV = "LIGHTNING_ANYACCEL_RECORD_RUN_TIMES"

_started: dict[str, float] = {}


class Setup(NamedTuple):
    """What ``start`` found: the accelerator, its device type and the package's facts about it."""

    accelerator: Any  # lightning_anyaccel.AnyAccelerator
    device_type: str
    spec: Any  # lightning_anyaccel.DeviceSpec


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _process_age() -> float:
    import psutil  # a dependency of the package

    return max(time.time() - psutil.Process().create_time(), 0.0)


def run_time_line(notebook: str, times: dict[str, Any] | None = None) -> str:
    """The header's run time of ``notebook``, from its last recorded run (``times``: :data:`RUN_TIMES`)."""
    if times is None:
        times = json.loads(RUN_TIMES.read_text()) if RUN_TIMES.exists() else {}
    run = times.get(notebook)
    if run is None:
        return "Run time: not measured yet (`make notebook-times` measures it)."
    return (f"Run time: {run['seconds']:.0f} s on {run['cpus']} CPU cores (load average {run['load']:.1f} "
            f"at the end), measured when this notebook last ran to its end ({run['date']}).")


def start(notebook: str) -> Setup:
    """Set the notebook up, print the device and the versions, show the recorded run time.

    Args:
        notebook: the notebook's file name without ``.ipynb``; ``finish`` records the time under it.
    """
    import lightning as L
    import torch
    from IPython.display import Markdown, display

    import lightning_anyaccel
    from lightning_anyaccel import AnyAccelerator, get_spec
    from lightning_anyaccel.kit.tools.local_runs import quiet_lightning

    # from the kernel's start on the first call in a process ("Run All" in a fresh kernel: the imports and
    # the kernel's own start count too), from this call when the notebook runs again in the same kernel
    first = not _started
    _started.clear()
    _started[notebook] = time.time() - (_process_age() if first else 0.0)
    quiet_lightning()
    torch.set_num_threads(1)  # the tutorial's models are small: more CPU threads only cost time
    accelerator = AnyAccelerator()  # the device torch.accelerator reports, else the CPU
    device_type = accelerator.device_type
    assert device_type is not None, "AnyAccelerator() resolves its device type"
    spec = get_spec(device_type)
    display(Markdown(f"*{run_time_line(notebook)}*"))
    print(f"device type: {device_type} ({spec.name})")
    print(f"torch {torch.__version__}, lightning {L.__version__}, "
          f"lightning-anyaccel {lightning_anyaccel.__version__}")
    return Setup(accelerator, device_type, spec)


def finish() -> None:
    """Print this run's time since ``start``; record it where :data:`RECORD_ENV` says."""
    if not _started:
        raise RuntimeError("finish() before start(): run the notebook from its first cell")
    (notebook, began), = _started.items()
    seconds = time.time() - began
    load = os.getloadavg()[0]
    print(f"{notebook}: {seconds:.0f} s from the kernel's start to here on {_cpus()} CPU cores "
          f"(load average {load:.1f})")
    target = os.environ.get(RECORD_ENV)
    if target:
        path = Path(target)
        times = json.loads(path.read_text()) if path.exists() else {}
        times[notebook] = {"seconds": round(seconds, 1), "cpus": _cpus(), "load": round(load, 1),
                           "date": datetime.date.today().isoformat()}
        path.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


def say(text: str) -> Any:
    """Markdown for the notebook, written from the run's results (``say(f"... {accuracy:.3f} ...")``)."""
    from IPython.display import Markdown

    return Markdown(text)
