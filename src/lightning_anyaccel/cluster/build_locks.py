"""Lock files of torch's extension builds (DeepSpeed's ops), checked before DeepSpeed starts.

DeepSpeed compiles its ops on first use through ``torch.utils.cpp_extension.load``, which takes
a lock by creating ``$TORCH_EXTENSIONS_DIR/<op>/lock`` (by default under ``~/.cache/torch_extensions``)
and deletes it when the build ends. A process killed during the build leaves the file behind, and
every later run waits on it forever
(``FileBaton.wait`` polls without a limit, in ``torch/utils/file_baton.py``) — silently.

:func:`wait_for_build_locks` runs before DeepSpeed initializes: it waits, bounded, for the lock
files under the extensions directory to disappear (another process may be building the op right
now) and fails with the lock file's path and the command that removes it when one outlives the
bound, or is already older than the bound (then no build holds it).

Example:
    >>> import tempfile
    >>> wait_for_build_locks(tempfile.mkdtemp(), timeout=1.0)  # no lock: returns at once
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from lightning_anyaccel.troubleshooting import LinkedError

log = logging.getLogger(__name__)

#: Seconds a lock file may be waited on (override: ``LIGHTNING_ANYACCEL_BUILD_LOCK_TIMEOUT``).
DEFAULT_TIMEOUT = 600.0
TIMEOUT_ENV = "LIGHTNING_ANYACCEL_BUILD_LOCK_TIMEOUT"


class StaleBuildLockError(LinkedError, RuntimeError):
    """A torch extension build lock outlived the bound (a killed build left it)."""


def extensions_root() -> Path:
    """Where torch builds extensions: ``$TORCH_EXTENSIONS_DIR``, else torch's default build root."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def find_build_locks(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """The ``lock`` files of extension builds under ``root`` (an op's folder, or one level deeper)."""
    base = Path(root) if root is not None else extensions_root()
    if not base.is_dir():
        return []
    return sorted({*base.glob("*/lock"), *base.glob("*/*/lock")})


def default_timeout() -> float:
    """:data:`DEFAULT_TIMEOUT`, or ``$LIGHTNING_ANYACCEL_BUILD_LOCK_TIMEOUT`` seconds."""
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT)


def wait_for_build_locks(
    root: str | os.PathLike[str] | None = None, timeout: float | None = None, poll: float = 0.5
) -> None:
    """Wait, at most ``timeout`` seconds, until no extension build holds a lock under ``root``.

    Args:
        root: the extensions directory (default: :func:`extensions_root`).
        timeout: the bound (default: :func:`default_timeout`).
        poll: seconds between looks.

    Raises:
        StaleBuildLockError: a lock file is older than ``timeout``, or still there after it; the
            message names the file and how to remove it.
    """
    bound = default_timeout() if timeout is None else timeout
    deadline = time.monotonic() + bound
    warned: set[Path] = set()
    while True:
        locks = find_build_locks(root)
        if not locks:
            return
        for lock in locks:
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:  # the build just finished
                continue
            if age > bound or time.monotonic() > deadline:
                raise StaleBuildLockError(
                    f"The build lock {lock} is {age:.0f} s old, past the bound of {bound:.0f} s"
                    f" (${TIMEOUT_ENV}): a build of the {lock.parent.name!r} extension (a DeepSpeed op) was"
                    f" probably killed and left it, and torch would wait on it forever. If no other process is"
                    f" building it, remove it (`rm {lock}`) and run again."
                )
            if lock not in warned:
                warned.add(lock)
                log.warning("Waiting (at most %.0f s) for %s: another process is building %r.", bound, lock,
                            lock.parent.name)
        time.sleep(poll)


__all__ = ["DEFAULT_TIMEOUT", "TIMEOUT_ENV", "StaleBuildLockError", "extensions_root", "find_build_locks",
           "wait_for_build_locks"]
