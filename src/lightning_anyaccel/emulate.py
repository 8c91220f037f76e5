"""``python -m lightning_anyaccel.emulate``: run a program, unchanged, on an emulated accelerator.

The command's entry; the implementation is :mod:`lightning_anyaccel.kit.emulate`.
"""

import sys

from lightning_anyaccel.kit.emulate import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
