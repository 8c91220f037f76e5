"""Run an example of ``examples/`` for the tests: ``shard_run.py`` and ``workload_run.py`` call it.

Lightning's popen launcher starts the other ranks by re-running the script it was started from, so
each of those scripts stays a file of its own and calls :func:`run_example` at the top level.

With ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives are marked unavailable,
so DeepSpeed uses plain gloo and does not compile its ``shm_comm`` op (about a minute on a
2-core CI machine). That op is a CPU-only speed-up; accelerators never use it.

The example is imported and its ``main()`` called, not run with ``runpy``: ``runpy`` sets
``sys.argv[0]`` to the example, so Lightning's popen launcher would start the other ranks from
the example itself and skip the switch above (rank 1 compiled the op while rank 0 did not).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def quiet_process() -> None:
    """One CPU thread unless told otherwise; with ``ANYACCEL_DS_NO_SHM=1``, DeepSpeed's shared-memory CPU
    collectives marked unavailable (plain gloo, no minute-long compile of ``shm_comm`` on 2 cores)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":
        try:
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        except ImportError:
            pass


def run_example(name: str) -> None:
    """Import ``examples/<name>.py`` (after the switches above) and call its ``main()``."""
    quiet_process()
    sys.path.insert(0, str(EXAMPLES))
    importlib.import_module(name).main()
