"""Run ``examples/workloads.py`` for ``tests/test_workloads.py``; popen DDP re-runs this file per rank.

As in ``shard_run.py``: with ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives
are marked unavailable, so DeepSpeed uses gloo and does not compile its ``shm_comm`` op (about a
minute on a 2-core CI machine; accelerators never use it). The example is imported, not run with
``runpy``, so the other ranks re-run this file and get the same switch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":
    try:
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except ImportError:
        pass

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import workloads  # noqa: E402

if __name__ == "__main__":
    workloads.main()
