"""Load the emulated accelerator in every Python process when LIGHTNING_ANYACCEL_EMULATE is set.

Put this directory on PYTHONPATH and set e.g. ``LIGHTNING_ANYACCEL_EMULATE=npu`` (``npu:4`` for four
devices): scripts, popen/spawn children and notebook kernels then see the device without code
changes. Test support for lightning-anyaccel; see docs/emulator.md.
"""

import importlib.util
import os
import sys

# The tests' import trimming (tests/lean_imports/lean_imports.py), when its folder is on PYTHONPATH too.
# Only that module: the folder itself (tests/lean_imports, found as a namespace package wherever tests/
# is on sys.path, as it is below) has nothing to install.
_lean = importlib.util.find_spec("lean_imports")
if _lean is not None and _lean.origin is not None and _lean.submodule_search_locations is None:
    import lean_imports

    lean_imports.install()

if os.environ.get("LIGHTNING_ANYACCEL_EMULATE", "").strip():
    _tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if _tests not in sys.path:
        sys.path.append(_tests)
    import emulator

    emulator.autoload_from_env()
