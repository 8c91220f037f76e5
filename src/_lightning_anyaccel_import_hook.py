"""What the start-up hook and the package share: ``LIGHTNING_ANYACCEL_ACTIVATE`` and an import hook.

The bottom of the import graph, beside the package in ``src/``: :mod:`_lightning_anyaccel_startup` (the
module the ``.pth`` line arms, at the top: it imports the package) and the package's ``registration`` and
``activation`` read the variable and watch imports through this module, which imports only ``os`` and
``sys`` (``importlib.util`` once a watched module is imported), so that a start-up that arms the hook stays
cheap and no import chain comes back to where it started.

Example:
    >>> activation_requested({"LIGHTNING_ANYACCEL_ACTIVATE": "0"})
    False
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing: this module may load at every start-up
if TYPE_CHECKING:  # at run time, only os and sys (importlib.util once a watched module is imported)
    import importlib.machinery
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

#: The environment variable the start-up hook reads.
ACTIVATE_ENV = "LIGHTNING_ANYACCEL_ACTIVATE"
#: Its accepted values: on and off.
ACTIVATE_VALUES = {"1": True, "0": False}
#: The modules whose import puts the package to work (the top-level packages of both Lightning packages).
LIGHTNING_MODULES = ("lightning", "pytorch_lightning", "lightning_fabric")


def activation_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``LIGHTNING_ANYACCEL_ACTIVATE`` asks for the package (``"1"``; unset, empty or ``"0"``: no).

    Raises:
        ValueError: any other value, naming the accepted ones.

    >>> activation_requested({"LIGHTNING_ANYACCEL_ACTIVATE": "1"}), activation_requested({})
    (True, False)
    """
    value = environ.get(ACTIVATE_ENV, "").strip()
    if not value:
        return False
    if value not in ACTIVATE_VALUES:
        accepted = ", ".join(f"{v!r}" for v in ACTIVATE_VALUES)
        raise ValueError(
            f"{ACTIVATE_ENV}={value!r} is not one of {accepted}: '1' puts lightning-anyaccel to work for every"
            f" program that imports Lightning, '0' (or unset) does not."
        )
    return ACTIVATE_VALUES[value]


#: Watched modules that were found but whose code has not finished running yet.
INCOMPLETE: set[str] = set()


def when_imported(name: str, callback: Callable[[], Any]) -> None:
    """Run ``callback`` once module ``name`` is imported: now if it is, else right after its code ran.

    Installs an import hook (:class:`AfterImport`) that removes itself when it has fired.
    """
    if name in sys.modules:
        callback()
    elif not any(isinstance(f, AfterImport) and f.name == name and f.callback == callback for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(name, callback))


class AfterImport:
    """An import hook (a meta path finder): lets the regular finders find ``name``, then runs ``callback`` once it
    was executed.

    ``find_spec`` is also called by mere look-ups (``importlib.util.find_spec``); the hook stays
    installed until the module is really executed, then removes itself. (Not derived from
    ``importlib.abc.MetaPathFinder``: ``sys.meta_path`` needs only ``find_spec``, and importing
    ``importlib.abc`` costs every start-up that arms the hook.)
    """

    def __init__(self, name: str, callback: Callable[[], Any]) -> None:
        self.name = name
        self.callback = callback
        self._finding = False

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._finding:
            return None
        import importlib.util

        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        loader = spec.loader if spec is not None else None
        if loader is not None and hasattr(loader, "exec_module"):
            execute = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                INCOMPLETE.add(self.name)
                try:
                    execute(module)
                finally:
                    INCOMPLETE.discard(self.name)
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                    self.callback()

            loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


__all__ = ["ACTIVATE_ENV", "ACTIVATE_VALUES", "INCOMPLETE", "LIGHTNING_MODULES", "AfterImport", "activation_requested",
           "when_imported"]
