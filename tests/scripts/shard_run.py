"""Run ``examples/shard_train.py`` for the tests; popen DDP re-runs this file per rank (``example_prelude.py``)."""

from example_prelude import run_example

if __name__ == "__main__":
    run_example("shard_train")
