"""Keep test processes from importing what torchmetrics imports eagerly and no test needs.

Every process that imports Lightning imports torchmetrics (Lightning's version checks do), and
torchmetrics imports ``scipy.signal``, ``transformers`` (for its text metrics) and ``matplotlib``
(for ``Metric.plot``) at import time when they are installed: about half of the 4 s of CPU each
test interpreter spends on imports (``python -X importtime -c "import lightning_anyaccel"``).
Upstream: https://github.com/Lightning-AI/torchmetrics/issues/3457. The test processes use none of
torchmetrics' text, audio or plotting parts, so there torchmetrics is told these packages are
absent: its availability flags read ``False`` once ``torchmetrics.utilities.imports`` has run, and
``lightning_utilities``' ``package_available("scipy")`` says ``False`` while ``torchmetrics`` itself
is being imported. Nothing else changes: the tests that train Hugging Face models import
``transformers`` themselves, and notebooks import ``matplotlib`` themselves.

One more package is kept out of test processes altogether: ``jsonschema`` (imported by every pytest
process through nbmake's plugin and nbformat, and by JupyterLab and nbclient) imports the optional
``rfc3987_syntax`` when it is installed, which builds a parser from its grammar at import time (1.1 s
of each such process) to check the ``"iri"`` string format, a check no test process makes. Imported
here, it is missing (:data:`ABSENT`), as jsonschema allows.

Test support only: ``tests/conftest.py`` installs it in the pytest process and puts this folder on
``PYTHONPATH``, whose ``sitecustomize.py`` installs it in every child process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: The availability flags of ``torchmetrics.utilities.imports`` set to ``False`` (each must exist).
FLAGS = ("_MATPLOTLIB_AVAILABLE", "_SCIPY_AVAILABLE", "_SCIPI_AVAILABLE", "_SCIPY_GREATER_EQUAL_1_8",
         "_TRANSFORMERS_AVAILABLE", "_TRANSFORMERS_GREATER_EQUAL_4_4", "_TRANSFORMERS_GREATER_EQUAL_4_10")
#: Packages ``package_available`` denies while ``torchmetrics`` runs its ``__init__``.
DENIED = frozenset({"scipy"})
#: Optional imports that are missing in test processes (each one's importer must allow that).
ABSENT = frozenset({"rfc3987_syntax"})


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then adjusts the module (``torchmetrics`` or its ``utilities.imports``)."""

    def __init__(self, real: importlib.abc.Loader, after: Callable[[ModuleType], Any] | None,
                 around: Callable[[Callable[[], None]], None] | None) -> None:
        self.real, self.after, self.around = real, after, around

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        def run() -> None:
            self.real.exec_module(module)

        if self.around:
            self.around(run)
        else:
            run()
        if self.after:
            self.after(module)


def _flags_false(module: ModuleType) -> None:
    for name in FLAGS:
        if hasattr(module, name):
            setattr(module, name, False)


def _denying(run: Callable[[], None]) -> None:
    """Run ``torchmetrics``' ``__init__`` with ``package_available`` denying :data:`DENIED`."""
    try:
        from lightning_utilities.core import imports
    except ImportError:
        run()
        return
    real = imports.package_available
    imports.package_available = lambda name: False if name in DENIED else real(name)
    try:
        run()
    finally:
        imports.package_available = real


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``torchmetrics`` and ``torchmetrics.utilities.imports``; finds none of :data:`ABSENT`."""

    HOOKS: dict[str, tuple[Callable[[ModuleType], Any] | None, Callable[[Callable[[], None]], None] | None]] = {
        "torchmetrics": (None, _denying),
        "torchmetrics.utilities.imports": (_flags_false, None),
    }

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in ABSENT:
            raise ModuleNotFoundError(f"No module named {fullname!r} (left out of test processes: {__file__})",
                                      name=fullname)
        if fullname not in self.HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, *self.HOOKS[fullname])
        return spec


def install() -> None:
    """Install the finder (once; a no-op when torchmetrics is already imported)."""
    if "torchmetrics" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
