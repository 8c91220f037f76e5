"""Load the emulated accelerator in every Python process when LIGHTNING_ANYACCEL_EMULATE is set.

Put this directory on PYTHONPATH and set e.g. ``LIGHTNING_ANYACCEL_EMULATE=npu`` (``npu:4`` for four
devices): scripts, popen/spawn children and notebook kernels then see the device without code
changes. Test support for lightning-anyaccel; see docs/emulator.md.
"""

import os
import sys

if os.environ.get("LIGHTNING_ANYACCEL_EMULATE", "").strip():
    _tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if _tests not in sys.path:
        sys.path.append(_tests)
    import emulator

    emulator.autoload_from_env()

try:  # the tests' import trimming (tests/lean_imports), when its folder is on PYTHONPATH too
    import lean_imports
except ImportError:
    pass
else:
    lean_imports.install()
