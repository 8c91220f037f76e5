"""No process of a job outlives it: the launching process and its workers watch each other.

A rank that hangs inside a driver or is stopped (``SIGSTOP``, a debugger, a stuck device) can
react to nothing but ``SIGKILL``. When the other ranks give up (the strategy's ``timeout``), the
job must still end *completely*: Lightning's launchers send ``SIGTERM`` (which a stopped process
never handles) or nothing at all, and a stopped worker re-parented to ``init`` keeps its device
until someone kills it by hand. Three mechanisms, all started by the strategies:

- :func:`prepare_launch` runs in the process that starts the workers (rank 0 of a node with
  ``start_method="popen"``, the parent with ``spawn``/``fork``). It marks the job
  (:data:`LAUNCHER_PID_ENV`) and starts a reaper thread that ``SIGKILL``\\ s any child that is
  stopped while a ``SIGTERM`` waits for it (torch's ``spawn`` join and Lightning send
  ``SIGTERM`` to the survivors of a failed job), and at exit ends the children still running:
  stopped ones at once; running ones after :data:`EXIT_GRACE_S` when the launching process
  exits with an error, and after :data:`FINISH_GRACE_S` when it finished normally (a slower rank
  is still writing its results then; nothing is printed unless it has to be killed).
- :func:`supervise_worker` runs in every worker the package launched; :func:`watch_launcher` in
  every rank of an external launcher (``torchrun``, ``srun``, ``mpirun``/``mpiexec``) too. One
  long-lived thread polls the parent every :data:`LAUNCHER_POLL_S`: when the launcher is gone
  (``SIGKILL`` included) it ``SIGKILL``\\ s every process the rank started (DataLoader and compile
  workers) and ends the rank, within about 0.5 s. A worker of the package's own launcher is also
  ``SIGKILL``\\ ed by the kernel when its launcher ends (``prctl(PR_SET_PDEATHSIG)``), stopped or stuck
  in C code too; what it started then ends through torch's own check of a worker's parent. At
  exit, a worker whose launching process is stopped kills it, so a frozen rank 0 does not keep a
  failed node alive.

Example:
    >>> signal_pending(os.getpid(), 15)
    False
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from lightning_anyaccel import _lightning

log = logging.getLogger(__name__)

#: Set by a launching process for the workers it starts (its pid), so they know whom to follow.
LAUNCHER_PID_ENV = "LIGHTNING_ANYACCEL_LAUNCHER_PID"

#: Seconds a launching process that exits with an error waits for running (not stopped) workers before killing them.
EXIT_GRACE_S = 5.0

#: Seconds a launching process that finished normally waits for its running workers to finish too.
FINISH_GRACE_S = 120.0

#: How often the reaper thread looks at the children (seconds).
REAP_PERIOD_S = 0.5

_PR_SET_PDEATHSIG = 1
_reaper: threading.Thread | None = None
_supervised_by: int | None = None
_lock = threading.Lock()
#: Set when this process is ending with an unhandled exception (see :func:`_note_error_exit`).
_error_exit = False

#: Exit status of a process ended by a :class:`~lightning_anyaccel.cluster.rendezvous.Deadline` or :func:`watch_parent`.
EXIT_CODE = 3


def end_process(message: str) -> None:
    """Print ``message`` and end the process now, from any thread (the main one may be stuck in C)."""
    try:
        sys.stderr.write(f"\n[lightning_anyaccel] {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_CODE)


def watch_parent(parent_pid: int, rank: int, period_s: float = 0.5) -> threading.Thread | None:
    """End this process when ``parent_pid`` (the launching process) is no longer its parent.

    Returns the watching thread, or ``None`` when ``parent_pid`` is not our parent (nothing to watch).
    """
    if os.getppid() != parent_pid:
        return None

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        end_process(f"rank {rank}: the process that launched this one (pid {parent_pid}) died; exiting so no orphan is left.")

    thread = threading.Thread(target=watch, name="anyaccel-parent-watch", daemon=True)
    thread.start()
    return thread


#: How often a rank looks whether its launcher is still its parent (seconds); the bound is a few periods.
LAUNCHER_POLL_S = 0.25
_launcher_watch: threading.Thread | None = None


def kill_own_children() -> list[int]:
    """``SIGKILL`` every process this one started, recursively (DataLoader and compile workers); their pids."""
    import psutil

    try:
        family = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    for child in family:
        try:
            child.kill()
        except psutil.Error:
            pass
    return [child.pid for child in family]


def watch_launcher(rank: int, period_s: float = LAUNCHER_POLL_S) -> threading.Thread | None:
    """In a rank, under any launcher: when the launcher (this process's parent now) dies, end this rank and
    every process it started, within about two periods.

    Polls ``getppid()`` from one long-lived thread, started once before any DataLoader worker is
    forked. Unlike ``PR_SET_PDEATHSIG``, which fires when the *thread* that forked the rank exits,
    this follows the launcher *process*: a launcher that forks from a helper thread keeps its
    healthy ranks. ``None`` when already watching or when the parent is ``init`` (nothing to follow).
    """
    global _launcher_watch
    parent = os.getppid()
    with _lock:
        if parent <= 1 or (_launcher_watch is not None and _launcher_watch.is_alive()):
            return None

        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(period_s)
            killed = kill_own_children()
            end_process(f"rank {rank}: its launcher (pid {parent}) died; ending this rank and the {len(killed)}"
                        " process(es) it started so that nothing outlives the job.")

        _launcher_watch = threading.Thread(target=watch, name="anyaccel-launcher-watch", daemon=True)
        _launcher_watch.start()
        return _launcher_watch


def _proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from ``/proc`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie), ``None`` if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` was sent to ``pid`` and not handled yet (Linux; ``False`` elsewhere)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signum - 1)
    for line in status.splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) & bit:
            return True
    return False


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (``SIGSTOP``/``SIGTSTP``, or traced)."""
    return _proc_state(pid) in ("T", "t")


def children(pid: int | None = None) -> list[int]:
    """The live (not zombie) direct children of ``pid`` (default: this process)."""
    pid = pid or os.getpid()
    found: set[int] = set()
    tasks = Path(f"/proc/{pid}/task")
    try:
        for task in tasks.iterdir():
            text = (task / "children").read_text()
            found.update(int(item) for item in text.split())
    except OSError:
        import psutil

        try:
            found = {child.pid for child in psutil.Process(pid).children()}
        except psutil.Error:
            return []
    return sorted(child for child in found if _proc_state(child) not in (None, "Z"))


def _kill(pid: int, why: str) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    sys.stderr.write(f"[lightning_anyaccel] killed process {pid}: {why}\n")
    sys.stderr.flush()


def reap_stopped_children() -> list[int]:
    """``SIGKILL`` the children that are stopped while a ``SIGTERM`` waits for them; their pids."""
    killed = []
    for child in children():
        if is_stopped(child) and signal_pending(child, signal.SIGTERM):
            _kill(child, "it was asked to terminate (SIGTERM) but is stopped and can only end with SIGKILL")
            killed.append(child)
    return killed


def _reap_forever() -> None:
    while True:
        try:
            reap_stopped_children()
        except Exception:  # never let the watcher die of a /proc race
            pass
        time.sleep(REAP_PERIOD_S)


def _is_worker(pid: int) -> bool:
    """Whether child ``pid`` is one of this process's workers: a ``popen`` worker (it carries the
    variable :func:`prepare_launch` set and a ``LOCAL_RANK`` above 0) or a ``multiprocessing`` child."""
    marker = f"{LAUNCHER_PID_ENV}={os.getpid()}".encode()
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    local_rank = next((item for item in environ if item.startswith(b"LOCAL_RANK=")), b"LOCAL_RANK=0")
    if marker in environ and local_rank != b"LOCAL_RANK=0":  # a popen worker (not a helper like a resource tracker)
        return True
    return pid in _lightning.multiprocessing_children()


def _note_error_exit() -> None:
    """Chain ``sys.excepthook`` so :func:`kill_children` knows the process is ending with an error."""
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, traceback: TracebackType | None) -> None:
        global _error_exit
        _error_exit = True
        previous(exc_type, exc, traceback)

    sys.excepthook = hook


def kill_children(grace_s: float | None = None) -> list[int]:
    """End this process's workers: stopped ones at once, running ones after ``grace_s``. Their pids.

    ``grace_s`` defaults to :data:`EXIT_GRACE_S` when this process is ending with an unhandled
    exception, else to :data:`FINISH_GRACE_S`: after a successful run a slower rank is let finish,
    silently. Other children (a TensorBoard the script started, data-loader workers) are left alone.
    """
    killed = []
    if grace_s is None:
        grace_s = EXIT_GRACE_S if _error_exit else FINISH_GRACE_S
    why = "its launching process is exiting after an error" if _error_exit else (
        f"it was still running {grace_s:.0f} s after its launching process finished")
    end = time.monotonic() + grace_s
    while True:
        alive = [child for child in children() if _is_worker(child)]
        for child in alive:
            if is_stopped(child):
                _kill(child, "its launching process is exiting (it was stopped)")
                killed.append(child)
            elif time.monotonic() >= end:
                _kill(child, why)
                killed.append(child)
        if not alive or time.monotonic() >= end:
            return killed
        time.sleep(0.1)


def prepare_launch() -> None:
    """In the process that is about to start the workers: mark them and watch them (idempotent).

    Sets :data:`LAUNCHER_PID_ENV` (inherited by every worker), starts the reaper thread and
    registers :func:`kill_children` at exit.
    """
    global _reaper
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    with _lock:
        if _reaper is not None and _reaper.is_alive():
            return
        _reaper = threading.Thread(target=_reap_forever, name="anyaccel-reaper", daemon=True)
        _reaper.start()
        _note_error_exit()
        atexit.register(kill_children)


def _die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent ends (Linux); whether that worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_pid() -> int | None:
    """The pid of the process that started this worker, if it was one of the package's launchers."""
    value = os.environ.get(LAUNCHER_PID_ENV)
    if not value:
        return None
    pid = int(value)
    return pid if pid != os.getpid() else None


def supervise_worker(rank: int) -> bool:
    """In a worker: end with the launching process, and kill it at exit if it is stopped.

    Does nothing (returns ``False``) in the launching process itself and in processes started
    by an external launcher (``torchrun``, ``srun``, ``mpiexec``: they end their workers).
    """
    global _supervised_by
    parent = launcher_pid()
    if parent is None:
        return False
    if os.getppid() != parent:
        if _proc_state(parent) in (None, "Z", "X"):  # the launcher died while this rank started (imports, Trainer)
            end_process(f"rank {rank}: the process that launched this one (pid {parent}) died; exiting.")
        return False  # a process the rank started, which inherited the variable: not a rank of this launcher
    if _supervised_by == parent:
        return True
    _supervised_by = parent
    # The kernel kills the rank when the launcher ends, even one stuck in C code holding the GIL, where the
    # launcher watch (a Python thread) could not run; the watch ends what the rank started while it runs.
    _die_with_parent(signal.SIGKILL)
    watch_launcher(rank)
    if os.getppid() != parent:  # it died before the watch started
        kill_own_children()
        end_process(f"rank {rank}: the process that launched this one (pid {parent}) died; exiting.")

    def kill_stopped_parent() -> None:
        if os.getppid() == parent and is_stopped(parent):
            _kill(parent, f"rank {rank} is exiting and the job's launching process is stopped")

    atexit.register(kill_stopped_parent)
    return True


@contextmanager
def report_failure(rank: Callable[[], int]) -> Iterator[None]:
    """Print which rank failed and why before the error leaves a worker.

    torch's ``spawn`` join re-raises only the *first* failed process's error in the launching
    process; when a rank raises and its peers then fail on the closed connection, the peers'
    error can come first and the original cause would be lost.
    """
    try:
        yield
    except BaseException as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        sys.stderr.write(f"[lightning_anyaccel] rank {rank()}: failed with {type(exc).__name__}: {text}\n")
        sys.stderr.flush()
        raise


__all__ = [
    "EXIT_CODE",
    "EXIT_GRACE_S",
    "end_process",
    "watch_parent",
    "FINISH_GRACE_S",
    "report_failure",
    "LAUNCHER_PID_ENV",
    "children",
    "is_stopped",
    "kill_children",
    "kill_own_children",
    "watch_launcher",
    "launcher_pid",
    "prepare_launch",
    "reap_stopped_children",
    "signal_pending",
    "supervise_worker",
]
