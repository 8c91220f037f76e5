"""CPython gh-112275: a forked DataLoader worker can deadlock in its start; say so on the Python releases that have it.

On CPython 3.8 to 3.11 before 3.8.20, 3.9.20, 3.10.15 and 3.11.10 (released 2024-09-07), a process
forked while another thread holds the runtime's head lock deadlocks in ``PyOS_AfterFork_Child``
(``_PyEval_ReInitThreads`` -> ``_PyThreadState_DeleteExcept`` waiting on that lock). Threads that
Python does not own take the lock without the GIL each time they enter Python (a native thread of
a C++ library calling back into Python): ``tests/test_fork_deadlock.py`` reproduces the deadlock that
way, and measures none with Python-level threads starting and ending (those take the lock only
with the GIL, which the forking thread holds). 3.12 and later are not affected.

A DataLoader with worker processes forks them (the default start method on Linux); a deadlocked
worker never delivers a batch and the rank waits on its queue forever (the stall watchdog bounds
that wait). On an affected Python, :func:`avoid_fork` starts such a DataLoader's workers with
``forkserver`` instead (forked by a clean, single-threaded server), said once in the log, when
what a worker needs pickles (dataset, ``collate_fn``, ``worker_init_fn``) and the main module can be
imported again (a script, not a notebook). Otherwise the workers keep ``fork`` and
:func:`warn_if_affected` warns once, naming the issue and both fixes: a Python with the fix, or a
picklable dataset with ``multiprocessing_context="forkserver"``.

Example:
    >>> affected((3, 11, 7))
    True
    >>> affected((3, 11, 10)), affected((3, 12, 0))
    (False, False)
"""

from __future__ import annotations

import logging
import pickle
import sys
from typing import Any

import torch.multiprocessing as mp

log = logging.getLogger(__name__)

#: The first release of each affected series with the fix (CPython's 2024-09-07 releases).
FIXED_IN: dict[tuple[int, int], tuple[int, int, int]] = {
    (3, 8): (3, 8, 20), (3, 9): (3, 9, 20), (3, 10): (3, 10, 15), (3, 11): (3, 11, 10),
}
_warned = False
_switched = False


def affected(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> bool:
    """Whether a CPython ``version`` (major, minor, micro) has gh-112275."""
    fixed = FIXED_IN.get((version[0], version[1]))
    return fixed is not None and tuple(version[:3]) < fixed


def forks_workers(dataloader: Any) -> bool:
    """Whether ``dataloader`` starts worker processes by ``fork``."""
    if int(getattr(dataloader, "num_workers", 0) or 0) <= 0:
        return False
    context = getattr(dataloader, "multiprocessing_context", None)
    method = context.get_start_method() if context is not None else mp.get_start_method(allow_none=True) or (
        "fork" if sys.platform.startswith("linux") else "spawn")
    return method == "fork"


def warn_if_affected(dataloader: Any) -> bool:
    """Warn once when this Python has gh-112275 and ``dataloader`` forks its workers; whether it warned."""
    global _warned
    if _warned or sys.implementation.name != "cpython" or not affected() or not forks_workers(dataloader):
        return False
    _warned = True
    fixed = ".".join(map(str, FIXED_IN[sys.version_info[:2]]))
    reason = _unpicklable(dataloader)
    log.warning(
        "[lightning_anyaccel] Python %s can deadlock a forked DataLoader worker in its start (CPython gh-112275,"
        " fixed in %s): the rank then waits for a batch that never comes. The workers keep 'fork'%s. Upgrade"
        " Python, or pass multiprocessing_context='forkserver' to the DataLoader (the dataset must be picklable).",
        sys.version.split()[0], fixed, f": {reason}" if reason else "",
    )
    return True


class _Discard:
    """A file that keeps nothing: pickling into it checks that an object pickles without holding its bytes."""

    def write(self, data: bytes) -> int:
        return len(data)


def _unpicklable(dataloader: Any) -> str | None:
    """What a forkserver worker of ``dataloader`` could not receive, or ``None``: each part must pickle, and
    a class or function of ``__main__`` is found again only where the main module is a file."""
    main = sys.modules.get("__main__")
    if main is not None and not getattr(main, "__file__", None):
        return "the main module is interactive (a notebook or a REPL), which a worker can not import"
    for part in ("dataset", "collate_fn", "worker_init_fn"):
        try:
            pickle.Pickler(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(getattr(dataloader, part, None))
        except Exception as err:  # noqa: BLE001 - any failure means: keep fork
            return f"its {part} does not pickle ({type(err).__name__}: {err})"
    return None


def avoid_fork(dataloader: Any) -> bool:
    """On a Python with gh-112275, start ``dataloader``'s forked workers with ``forkserver`` where they can be.

    Returns whether it switched. Where what a worker needs does not pickle, the workers keep
    ``fork`` and :func:`warn_if_affected` warns (once); the switch is said once in the log.
    """
    global _switched
    if sys.implementation.name != "cpython" or not affected() or not forks_workers(dataloader):
        return False
    if "forkserver" not in mp.get_all_start_methods() or _unpicklable(dataloader) is not None:
        warn_if_affected(dataloader)
        return False
    dataloader.multiprocessing_context = "forkserver"
    if not _switched:
        _switched = True
        log.warning(
            "[lightning_anyaccel] Python %s can deadlock a forked DataLoader worker in its start (CPython gh-112275,"
            " fixed in %s): DataLoader workers start with multiprocessing_context='forkserver' instead of 'fork'.",
            sys.version.split()[0], ".".join(map(str, FIXED_IN[sys.version_info[:2]])),
        )
    return True


__all__ = ["FIXED_IN", "affected", "avoid_fork", "forks_workers", "warn_if_affected"]
