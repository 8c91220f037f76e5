"""Run ``examples/workloads.py`` for ``tests/test_workloads.py``; popen DDP re-runs this file per rank (``example_prelude.py``)."""

from example_prelude import run_example

if __name__ == "__main__":
    run_example("workloads")
