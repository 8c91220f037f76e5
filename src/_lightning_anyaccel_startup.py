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
(:mod:`lightning_anyaccel.wiring.activation`); the variable's rules and the import hook are
:mod:`_lightning_anyaccel_import_hook`'s, which both this module and the package import (this one
imports the package, so the package never imports this one).

Example:
    >>> arm({"LIGHTNING_ANYACCEL_ACTIVATE": "0"})
    False
"""

from __future__ import annotations

import os
import sys

from _lightning_anyaccel_import_hook import (
    ACTIVATE_ENV,
    ACTIVATE_VALUES,
    INCOMPLETE,
    LIGHTNING_MODULES,
    activation_requested,
    when_imported,
)

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing: this module may load at every start-up
if TYPE_CHECKING:
    from collections.abc import Mapping


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
    if any(name in sys.modules for name in INCOMPLETE):
        return
    activation_requested()  # raises on a wrong value, naming the accepted ones
    import lightning_anyaccel  # noqa: F401  (registers with Lightning)


__all__ = ["ACTIVATE_ENV", "ACTIVATE_VALUES", "LIGHTNING_MODULES", "activate", "activation_requested", "arm",
           "when_imported"]
