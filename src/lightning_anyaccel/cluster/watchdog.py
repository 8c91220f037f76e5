"""A hang anywhere becomes an error that says where every rank was: the stall watchdog.

Every collective is bounded by the strategy's ``timeout``; a rank can still hang elsewhere (a
DataLoader worker that never starts, a ``training_step`` that never returns, a first-time op
build that waits forever). :func:`start` runs one long-lived daemon thread per rank (and in the
one process of a single-device run). The strategies call :func:`progress` (one integer increment)
at every batch, backward, optimizer step and collective they run; under Fabric every forward of a
module it set up counts too (:func:`forward_progress`: an evaluation-only loop is progress). When the
counter has not moved for :func:`stall_timeout` seconds the thread, through
:func:`~lightning_anyaccel.cluster.stall_report.report`,

1. writes every thread's Python stack of this rank (``faulthandler``) to
   ``<dir>/rank<N>.stack`` and to stderr, and a native stack (``py-spy dump --native``) where
   ``py-spy`` is installed;
2. asks every other rank for its stacks, on every node: through the job's c10d store (the
   ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT`` every rank rendezvoused at; the first rank to report
   sets a key there, every rank's watchdog thread sees it at its next tick and posts its stacks
   under its rank), and on this host also with :data:`DUMP_SIGNAL` (a ``faulthandler`` handler in
   C that works while a rank's main thread holds the GIL in C); it waits for them a bounded time
   (:func:`answer_wait`) and names the ranks that did not answer;
3. prints one line per rank saying where it was (:func:`where`: ``in a DataLoader worker's
   start``, ``in all_reduce``, ``waiting for rank 1``, or the innermost frame outside
   torch/Lightning, ``file:line``), then every rank's stacks;
4. ends the job: ``SIGKILL`` to the other ranks of this host and to every process this rank
   started (DataLoader workers, compile workers), then ``os._exit`` with :data:`EXIT_CODE`; the
   ranks of other nodes, once told through the store, end themselves and their child processes the
   same way when the report is printed or the store goes away with the rank that held it.

Only one rank of the job reports (the first to claim it in the store; per host without a store).
Each tick costs a rank one ``check`` on the store (every :func:`tick` seconds, 5 s at the default bound).
A single-device run has no store: its watchdog reports its own stack.

The Trainer's teardown (end of ``fit``/``validate``/``test``) disarms it until the next setup; under
Fabric it stays armed until the process ends. The bound is ``stall_timeout=`` of every strategy of the package, else
``$LIGHTNING_ANYACCEL_STALL_TIMEOUT`` seconds, else :data:`DEFAULT_STALL_TIMEOUT_S` (30 min: a
first-time DeepSpeed op build or ``torch.compile`` of a large model takes minutes with no step);
``0`` or ``off`` turns the watchdog off.

Example:
    >>> stall_timeout(None, {"LIGHTNING_ANYACCEL_STALL_TIMEOUT": "off"}) is None
    True
    >>> stall_timeout(None, {"LIGHTNING_ANYACCEL_STALL_TIMEOUT": "90"})
    90.0
    >>> where(['  File "/x/torch/distributed/distributed_c10d.py", line 1, in all_reduce'])
    'in all_reduce'
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from lightning_anyaccel.cluster import stall_report
from lightning_anyaccel.cluster.stall_report import (
    DUMP_SIGNAL,
    EXIT_CODE,
    STORE_PREFIX,
    answer_wait,
    main_thread_stack,
    tick,
    where,
)

#: The environment variable that sets the stall bound in seconds (``0``/``off``: no watchdog).
STALL_TIMEOUT_ENV = "LIGHTNING_ANYACCEL_STALL_TIMEOUT"
#: Where the per-rank stack files go (default: a directory per job under the temporary directory).
STALL_DIR_ENV = "LIGHTNING_ANYACCEL_STALL_DIR"
#: The default bound: long enough for a first-time DeepSpeed op build or a large ``torch.compile``.
DEFAULT_STALL_TIMEOUT_S = 1800.0

_counter = [0]
_armed = threading.Event()
_thread: threading.Thread | None = None
_stack_file: IO[str] | None = None
_lock = threading.Lock()
_store: stall_report.JobStore | None = None


def progress() -> None:
    """Count one step of progress (a training step, a backward, a collective that completed)."""
    _counter[0] += 1


def forward_progress() -> None:
    """Count a forward as progress, except while ``torch.compile`` traces it (the increment would recompile
    the graph at every call). Fabric asks its strategy for the precision plugin at every forward of a
    set-up module; the package's Fabric strategies call this there, so an evaluation-only loop is progress.
    """
    if not _is_compiling():
        _counter[0] += 1


def _is_compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


def disarm() -> None:
    """Stop watching until the next :func:`start` (the Trainer's teardown: the process may idle after ``fit``)."""
    _armed.clear()


def stall_timeout(given: float | None, environ: Mapping[str, str] = os.environ) -> float | None:
    """The stall bound in seconds: ``given``, else ``$LIGHTNING_ANYACCEL_STALL_TIMEOUT``, else the default.

    ``None`` when the watchdog is off (``0``, ``off``, ``none``).

    Raises:
        ValueError: the variable is neither a number nor ``off``.
    """
    if given is not None:
        return float(given) if given > 0 else None
    value = environ.get(STALL_TIMEOUT_ENV, "").strip().lower()
    if not value:
        return DEFAULT_STALL_TIMEOUT_S
    if value in ("off", "none", "false", "0"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{STALL_TIMEOUT_ENV}={value!r} is neither a number of seconds nor 'off'.") from None
    return seconds if seconds > 0 else None


def stall_dir(job: str, environ: Mapping[str, str] = os.environ) -> Path:
    """The directory of this job's stack files (``$LIGHTNING_ANYACCEL_STALL_DIR``, else one per job in the temp dir)."""
    base = environ.get(STALL_DIR_ENV)
    path = Path(base) if base else Path(tempfile.gettempdir()) / f"lightning_anyaccel-{os.getuid()}-{job}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _watch(rank: int, directory: Path, bound: float, period: float) -> None:
    seen, since = _counter[0], time.monotonic()
    while True:
        time.sleep(period)
        if _store is not None and _armed.is_set() and stall_report.told(_store):
            stall_report.end_when_told(rank, _store, bound)
        if _counter[0] != seen or not _armed.is_set():
            seen, since = _counter[0], time.monotonic()
        elif time.monotonic() - since >= bound:
            try:
                stall_report.report(rank, directory, bound, _store,
                                    f"for {bound:.0f} s (stall_timeout / ${STALL_TIMEOUT_ENV})")
            finally:
                os._exit(EXIT_CODE)


def start(rank: int, job: str, given: float | None = None, store: tuple[str, int] | None = None,
          world_size: int = 1) -> threading.Thread | None:
    """Start this rank's watchdog (once per process); ``None`` when it is off.

    Args:
        rank: this process's global rank (named in the report).
        job: what the ranks of one job share (the rendezvous address and port), for the stack directory.
        given: the strategy's ``stall_timeout`` (seconds; ``0`` turns it off), ``None`` for the environment's.
        store: the address and port of the job's c10d ``TCPStore`` (``MASTER_ADDR``, ``MASTER_PORT``), through
            which the ranks of every node answer; ``None``: the ranks of this host only.
        world_size: the number of ranks of the job (those asked through ``store``).
    """
    global _thread, _stack_file, _store
    bound = stall_timeout(given)
    with _lock:
        if bound is None:
            return None
        progress()
        _armed.set()
        if _thread is not None and _thread.is_alive():
            return _thread
        directory = stall_dir(job)
        (directory / f"rank{rank}.pid").write_text(str(os.getpid()))
        _stack_file = (directory / f"rank{rank}.stack").open("w")
        if DUMP_SIGNAL:
            faulthandler.register(DUMP_SIGNAL, file=_stack_file, all_threads=True)
        _store = stall_report.JobStore(store, world_size) if store is not None and world_size > 1 else None
        _thread = threading.Thread(target=_watch, args=(rank, directory, bound, tick(bound)),
                                   name="anyaccel-watchdog", daemon=True)
        _thread.start()
        atexit.register(_clean_up, directory, rank)
        return _thread


def _clean_up(directory: Path, rank: int) -> None:
    """At a normal exit: remove this rank's files unless it wrote stacks, and the directory once empty.

    A stalled job ends with ``os._exit`` (no ``atexit``): its stacks stay where the report says.
    """
    stack = directory / f"rank{rank}.stack"
    if DUMP_SIGNAL:
        faulthandler.unregister(DUMP_SIGNAL)
    if _stack_file is not None:
        _stack_file.close()
    try:
        if stack.exists() and stack.stat().st_size == 0:
            stack.unlink()
            (directory / f"rank{rank}.pid").unlink(missing_ok=True)
        directory.rmdir()  # only when no other rank's file is left
    except OSError:
        pass


__all__ = ["DEFAULT_STALL_TIMEOUT_S", "DUMP_SIGNAL", "EXIT_CODE", "STALL_DIR_ENV", "STALL_TIMEOUT_ENV", "STORE_PREFIX",
           "answer_wait", "forward_progress", "disarm", "main_thread_stack", "progress", "stall_dir", "stall_timeout",
           "start", "tick", "where"]
