"""Run ``lightning_anyaccel.kit.tools.parity_run`` for the tests; popen DDP re-runs this file per rank.

``ANYACCEL_DS_NO_SHM=1`` marks DeepSpeed's shared-memory CPU collectives unavailable (as
``example_prelude.py`` does): plain gloo, no minute-long compile of ``shm_comm`` on a 2-core machine.
"""

if __name__ == "__main__":
    from example_prelude import quiet_process  # this folder: the tests' switches, written once

    quiet_process()
    from lightning_anyaccel.kit.tools.parity_run import main

    main()
