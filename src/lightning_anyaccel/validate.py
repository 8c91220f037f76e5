"""``python -m lightning_anyaccel.validate``: validate this machine's device and write a record to send in.

The command's entry; the implementation is :mod:`lightning_anyaccel.kit.validate`.
"""

import sys

from lightning_anyaccel.kit.validate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
