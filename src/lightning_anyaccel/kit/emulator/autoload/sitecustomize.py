"""Load the emulated accelerator in every Python process when LIGHTNING_ANYACCEL_EMULATE is set.

Put this directory on PYTHONPATH and set e.g. ``LIGHTNING_ANYACCEL_EMULATE=npu`` (``npu:4`` for four
devices): scripts, popen/spawn/torchrun/mpirun children and notebook kernels then see the device without
code changes (``python -m lightning_anyaccel.emulate`` sets both). See docs/emulate.md.

``lightning_anyaccel.kit.emulator`` is loaded from its folder without running ``lightning_anyaccel/__init__``
(which imports Lightning): a process that never imports the package does not pay for it, and one that
does imports it later, unchanged. A ``sitecustomize`` this one shadows (the tests' import trimming, a
site's own) runs first.
"""

import importlib.machinery
import importlib.util
import os
import sys

_FLAG = "_lightning_anyaccel_emulator_autoload"


def _run_the_shadowed_sitecustomize(here: str) -> None:
    """Python runs the first ``sitecustomize`` on ``sys.path`` only: run the next one after this folder."""
    folders = [os.path.abspath(p or ".") for p in sys.path]
    rest = sys.path[folders.index(here) + 1:] if here in folders else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _load_emulator(package: str) -> None:
    """Load the device named by the variable; a process that can not have it ends with the reason (exit 1).

    An interpreter without torch (a tool of another environment) has no device to get: it runs as it is.
    """
    if importlib.util.find_spec("torch") is None:
        return
    try:
        _load(package)
    except Exception as err:  # never a run on the CPU in place of the device asked for
        sys.stderr.write(f"emulator: this process can not have the emulated device"
                         f" {os.environ.get('LIGHTNING_ANYACCEL_EMULATE')!r}: {type(err).__name__}: {err}\n")
        sys.stderr.flush()
        os._exit(1)


def _load(package: str) -> None:
    name = "lightning_anyaccel.kit.emulator"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(package, "__init__.py"),
                                                      submodule_search_locations=[package])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    sys.modules[name].autoload_from_env()
    if os.environ.get("LIGHTNING_ANYACCEL_EMULATE_REPORT", "").strip():
        sys.modules[name].problems_install()


if _FLAG not in sys.modules:  # a chained sitecustomize may run this one again
    sys.modules[_FLAG] = type(sys)(_FLAG)
    _here = os.path.dirname(os.path.abspath(__file__))
    _run_the_shadowed_sitecustomize(_here)
    if os.environ.get("LIGHTNING_ANYACCEL_EMULATE", "").strip():
        _load_emulator(os.path.dirname(_here))
