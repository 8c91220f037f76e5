"""``python -m lightning_anyaccel.verify``: check that this environment can train, for any device.

The command's entry and its public functions (:func:`describe`, :func:`run`); the implementation is
:mod:`lightning_anyaccel.kit.verify`.
"""

import sys

from lightning_anyaccel.kit.verify import Report, describe, main, run

__all__ = ["Report", "describe", "main", "run"]

if __name__ == "__main__":
    sys.exit(main())
