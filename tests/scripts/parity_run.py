"""Run ``lightning_anyaccel.tools.parity_run`` for the tests; popen DDP re-runs this file per rank.

``ANYACCEL_DS_NO_SHM=1`` marks DeepSpeed's shared-memory CPU collectives unavailable (as
``example_prelude.py`` does): plain gloo, no minute-long compile of ``shm_comm`` on a 2-core machine.
"""

import os

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":
        try:
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        except ImportError:
            pass
    from lightning_anyaccel.tools.parity_run import main

    main()
