"""Run ``examples/shard_train.py`` for the tests; popen DDP re-runs this file per rank.

With ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives are marked unavailable,
so DeepSpeed uses plain gloo and does not compile its ``shm_comm`` op (about a minute on a
2-core CI machine). That op is a CPU-only speed-up; accelerators never use it.

The example is imported and its ``main()`` called, not run with ``runpy``: ``runpy`` sets
``sys.argv[0]`` to the example, so Lightning's popen launcher would start the other ranks from
the example itself and skip the switch above (rank 1 compiled the op while rank 0 did not).
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
import shard_train  # noqa: E402

if __name__ == "__main__":
    shard_train.main()
