"""Replacing a checkpoint on disk atomically: the previous one stays loadable at every moment.

A new checkpoint (a file, or a directory every rank wrote into) is written next to its target
under a temporary name, flushed to disk, then put in the target's place in one step
(:func:`commit`); :func:`recover` undoes the one window a file system without an atomic exchange
leaves. Used by :class:`~lightning_anyaccel.checkpoints.checkpoint.AtomicCheckpointIO` and by the sharded
strategies' saves (:mod:`lightning_anyaccel.strategies.atomic_save`).

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "new").write_text("2") and (root / "last.ckpt").write_text("1")
    1
    >>> commit(root / "new", root / "last.ckpt")
    >>> (root / "last.ckpt").read_text(), (root / "new").exists()
    ('2', False)
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from pathlib import Path

#: What Lightning's checkpoint IO accepts as a path (its own `_PATH`).
CheckpointPath = str | Path

#: Suffix of the temporary file a checkpoint is written to before it replaces the target.
TMP_SUFFIX = ".anyaccel-tmp"
#: Suffix of the sibling a sharded checkpoint is written into before it takes the target's place.
DIR_TMP_SUFFIX = ".anyaccel-tmp"
#: Suffix of the previous checkpoint while the new one takes its place (only where the file system
#: cannot exchange two names atomically); :func:`recover` puts it back after a kill.
OLD_SUFFIX = ".anyaccel-old"

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _fsync(path: Path) -> None:
    """Flush a file, or a directory's entries, to disk (best effort: some file systems refuse)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Persist a rename on file systems that need the directory synced (best effort)."""
    _fsync(directory)


def sibling(target: Path, suffix: str) -> Path:
    """The hidden name next to ``target`` that a new or old checkpoint of it goes by: ``.<name><suffix>``."""
    return target.with_name(f".{target.name}{suffix}")


def remove(path: Path) -> None:
    """Delete a checkpoint file or directory, if there is one."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk (best effort)."""
    if root.is_file():
        paths = [root]
    else:
        paths = [p for p in root.rglob("*") if p.is_file()]
    for path in paths:
        _fsync(path)
    for directory in {p.parent for p in paths} | {root.parent}:
        fsync_dir(directory)


def commit(staged: Path, target: Path) -> None:
    """Put the complete checkpoint ``staged`` (file or directory) at ``target``, atomically.

    The previous checkpoint at ``target`` stays loadable at every moment: the two names are
    exchanged in one step where the file system can (Linux, local file systems), else the old
    one is first renamed to ``.<name>.anyaccel-old``, which :func:`recover` restores after a kill.
    """
    if not (target.exists() or target.is_symlink()):
        os.rename(staged, target)
    elif _exchange(staged, target):
        remove(staged)  # now the previous checkpoint
    else:
        old = sibling(target, OLD_SUFFIX)
        remove(old)
        os.rename(target, old)
        os.rename(staged, target)
        remove(old)
    fsync_dir(target.parent)


def recover(path: CheckpointPath) -> Path:
    """``path``; if a kill hit between the two renames of :func:`commit`, first put the previous checkpoint back."""
    target = Path(path)
    old = sibling(target, OLD_SUFFIX)
    if not target.exists() and old.exists():
        os.rename(old, target)
    return target


__all__ = ["DIR_TMP_SUFFIX", "OLD_SUFFIX", "TMP_SUFFIX", "CheckpointPath", "commit", "fsync_dir", "fsync_tree", "recover", "remove", "sibling"]
