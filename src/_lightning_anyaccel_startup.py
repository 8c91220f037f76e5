"""Puts lightning-anyaccel to work for programs you don't edit: ``LIGHTNING_ANYACCEL_ACTIVATE=1``.

The package installs ``lightning_anyaccel_startup.pth`` next to itself in ``site-packages``
(``setup.py``); Python runs its one line at every start-up. The line only reads the environment
variable; when it is set, it imports this module and calls :func:`arm`, which imports nothing
heavy: it watches for Lightning (``lightning``, ``pytorch_lightning`` or ``lightning_fabric``) and
imports ``lightning_anyaccel`` right after Lightning, before the program builds its Trainer or
Fabric. A Python process that never imports Lightning never imports torch or the package.

This module is deliberately outside the ``lightning_anyaccel`` package: importing a submodule of
the package would run the package's ``__init__`` (torch and Lightning) at every start-up. The
package reads the same variable for what it changes while activated
(:mod:`lightning_anyaccel.activation`).

Example:
    >>> arm({"LIGHTNING_ANYACCEL_ACTIVATE": "0"})
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


def arm(environ: Mapping[str, str] = os.environ) -> bool:
    """Import ``lightning_anyaccel`` as soon as Lightning is imported, if ``LIGHTNING_ANYACCEL_ACTIVATE`` asks for it.

    Returns whether it was armed. A wrong value is not raised here (Python would only print it while
    it starts and go on): it is raised when the program imports Lightning, so the program stops there.
    """
    try:
        requested = activation_requested(environ)
    except ValueError:
        requested = True  # activate() raises the error once Lightning is imported
    if not requested:
        return False
    for name in LIGHTNING_MODULES:
        when_imported(name, activate)
    return True


def activate() -> None:
    """Import ``lightning_anyaccel`` (it registers with every Lightning package imported so far and later).

    Skipped while another Lightning package is still being imported (``pytorch_lightning`` imports
    ``lightning_fabric`` first): that one's own hook activates once it is complete.
    """
    if any(name in sys.modules for name in _INCOMPLETE):
        return
    activation_requested()  # raises on a wrong value, naming the accepted ones
    import lightning_anyaccel  # noqa: F401  (registers with Lightning)


#: Watched modules that were found but whose code has not finished running yet.
_INCOMPLETE: set[str] = set()


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
                _INCOMPLETE.add(self.name)
                try:
                    execute(module)
                finally:
                    _INCOMPLETE.discard(self.name)
                if self in sys.meta_path:
                    sys.meta_path.remove(self)
                    self.callback()

            loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


__all__ = ["ACTIVATE_ENV", "ACTIVATE_VALUES", "LIGHTNING_MODULES", "AfterImport", "activate", "activation_requested",
           "arm", "when_imported"]
