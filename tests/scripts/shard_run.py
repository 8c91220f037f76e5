"""Run ``examples/shard_train.py`` for the tests; popen DDP re-runs this file per rank.

With ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives are marked unavailable,
so DeepSpeed uses plain gloo and does not compile its ``shm_comm`` op (about a minute on a
2-core CI machine). That op is a CPU-only speed-up; accelerators never use it.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path

if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":
    try:
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    except ImportError:
        pass

runpy.run_path(str(Path(__file__).resolve().parents[2] / "examples" / "shard_train.py"), run_name="__main__")
