"""A hang anywhere becomes an error that says where every rank was: the stall watchdog.

Every collective is bounded by the strategy's ``timeout``; a rank can still hang elsewhere (a
DataLoader worker that never starts, a ``training_step`` that never returns, a first-time op
build that waits forever). :func:`start` runs one long-lived daemon thread per rank (and in the
one process of a single-device run). The strategies call :func:`progress` (one integer increment)
at every batch, backward, optimizer step and collective they run; under Fabric every forward of a
module it set up counts too (:func:`forward_progress`: an evaluation-only loop is progress). When the
counter has not moved for :func:`stall_timeout` seconds the thread

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
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lightning_anyaccel.cluster import supervision

if TYPE_CHECKING:
    import torch

#: The environment variable that sets the stall bound in seconds (``0``/``off``: no watchdog).
STALL_TIMEOUT_ENV = "LIGHTNING_ANYACCEL_STALL_TIMEOUT"
#: Where the per-rank stack files go (default: a directory per job under the temporary directory).
STALL_DIR_ENV = "LIGHTNING_ANYACCEL_STALL_DIR"
#: The default bound: long enough for a first-time DeepSpeed op build or a large ``torch.compile``.
DEFAULT_STALL_TIMEOUT_S = 1800.0
#: Exit status of a rank ended by the watchdog.
EXIT_CODE = 4
#: Seconds the stalled rank waits for the other ranks' stacks, at least (see :func:`answer_wait`).
PEER_DUMP_WAIT_S = 2.0
#: Where the watchdog's keys live in the job's store (a torchrun restart gets fresh ones).
STORE_PREFIX = "lightning_anyaccel/stall"

#: The signal that makes a rank write its stacks: a real-time one, so that ``SIGUSR1`` stays free for
#: preemption warnings (SLURM's ``--signal=USR1``, :class:`~lightning_anyaccel.checkpoints.preemption.PreemptionCheckpoint`).
DUMP_SIGNAL: int = int(getattr(signal, "SIGRTMIN", 0)) + 7 if hasattr(signal, "SIGRTMIN") else 0

_counter = [0]
_armed = threading.Event()
_thread: threading.Thread | None = None
_stack_file: IO[str] | None = None
_lock = threading.Lock()

_COLLECTIVE = re.compile(r'torch/distributed/distributed_c10d\.py", line \d+,? in (\w+)')
_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+)(?:,? in (\S+))?')
_LIBRARY = ("/torch/", "/lightning/", "/pytorch_lightning/", "/lightning_fabric/", "/deepspeed/", "/threading.py",
            "/multiprocessing/", "/queue.py", "/selectors.py", "/lightning_anyaccel/", "/site-packages/", "<frozen")


class _JobStore:
    """This rank's client of the job's c10d store, for the watchdog's keys (connected by the watchdog thread)."""

    def __init__(self, address: tuple[str, int], world_size: int) -> None:
        self.address, self.world_size = address, world_size
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"{STORE_PREFIX}/{address[1]}/{restart}"
        self.client: Any = None

    def connect(self) -> bool:
        """Connect once (10 s at most); ``False`` where the store can not be reached (the watchdog works per host)."""
        if self.client is None:
            import torch.distributed as dist

            try:
                self.client = dist.TCPStore(self.address[0], self.address[1], is_master=False,
                                            timeout=timedelta(seconds=10), wait_for_workers=False)
            except (RuntimeError, ValueError, OSError):
                self.client = False
        return bool(self.client)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def has(self, name: str) -> bool:
        return bool(self.client.check([self.key(name)]))

    def get(self, name: str) -> str:
        return bytes(self.client.get(self.key(name))).decode(errors="replace")


_store: _JobStore | None = None


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


def where(stack: Sequence[str]) -> str:
    """Where a rank waits, from its main thread's stack (``faulthandler`` or ``traceback`` lines, outermost first)."""
    text = "\n".join(stack)
    if "torch/utils/data/dataloader.py" in text and re.search(r"in (_try_get_data|_get_data|_next_data)", text):
        return "in a DataLoader worker's start or batch (waiting on its queue)"
    if "multiprocessing/popen_fork.py" in text:
        return "in a DataLoader worker's start (forking it)"
    collectives = _COLLECTIVE.findall(text)
    if collectives:
        return f"in {collectives[-1]}"
    if re.search(r'torch/autograd/(?:__init__|graph)\.py", line \d+,? in (backward|_engine_run_backward)', text):
        return "in backward (DDP's gradient all-reduce waits there for the other ranks)"
    frames = [match for match in (_FRAME.match(line) for line in stack) if match]
    user = [m for m in frames if not any(part in m.group(1) for part in _LIBRARY)]
    if not frames:
        return "somewhere without a Python frame"
    frame = (user or frames)[-1]
    return f"at {frame.group(1)}:{frame.group(2)}" + (f" in {frame.group(3)}" if frame.group(3) else "")


def main_thread_stack(dump: str) -> list[str]:
    """The main thread's lines of a ``faulthandler`` dump, outermost first (it prints innermost first)."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", dump)
    main = next((b for b in blocks if "in <module>" in b or "_bootstrap" not in b), blocks[0] if blocks else "")
    return list(reversed([line for line in main.splitlines() if line.strip().startswith("File")]))


def _peers(directory: Path) -> dict[int, int]:
    """The other ranks of this host that registered in ``directory``: rank -> pid."""
    found = {}
    for path in directory.glob("rank*.pid"):
        try:
            rank, pid = int(path.stem[4:]), int(path.read_text())
        except ValueError:
            continue
        if pid != os.getpid() and supervision._proc_state(pid) not in (None, "Z"):
            found[rank] = pid
    return found


def _native(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return ""
    try:
        return subprocess.run([spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _kill_tree(pid: int) -> None:
    """``SIGKILL`` ``pid`` and its descendants, except this process (it ends itself last)."""
    import psutil

    try:
        process = psutil.Process(pid)
        family = [*process.children(recursive=True), process]
    except psutil.Error:
        return
    for member in family:
        if member.pid == os.getpid():
            continue
        try:
            member.kill()
        except psutil.Error:
            pass


def _first_reporter(directory: Path) -> bool:
    """Whether this rank reports (no other live rank of this host is reporting already: it will end this one)."""
    claim = directory / "reporting"
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = int(claim.read_text() or 0)
            except (OSError, ValueError):
                holder = 0
            if holder and supervision._proc_state(holder) not in (None, "Z"):
                return False
            claim.unlink(missing_ok=True)  # left by an earlier job on the same address
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return True
    return False


def tick(bound: float) -> float:
    """Seconds between two looks of the watchdog thread: a tenth of the bound, from 0.2 to 5."""
    return min(5.0, max(0.2, bound / 10))


def answer_wait(bound: float) -> float:
    """Seconds the reporting rank waits for the other ranks' stacks, at most: two of their ticks and 2 s."""
    return 2 * tick(bound) + PEER_DUMP_WAIT_S


def _own_stacks() -> str:
    """Every thread's Python stack of this process, as ``faulthandler`` writes them."""
    with tempfile.TemporaryFile("w+") as handle:
        faulthandler.dump_traceback(handle, all_threads=True)
        handle.seek(0)
        return handle.read()


def _told(store: _JobStore) -> bool:
    """Whether a rank of the job asked for every rank's stacks (``False`` where the store is unreachable)."""
    try:
        return store.connect() and store.has("fired")
    except (RuntimeError, OSError):
        return False


def _end_when_told(rank: int, store: _JobStore, bound: float) -> None:
    """Another rank reports: post this rank's stacks, wait until it printed them (or its store is gone), end."""
    reporter = "another rank"
    try:
        store.client.set(store.key(f"stack/{rank}"), f"{socket.gethostname()} {os.getpid()}\n{_own_stacks()}")
        reporter = f"rank {store.get('reporter')}" if store.has("reporter") else reporter
        deadline = time.monotonic() + answer_wait(bound) + 60  # the report may add native stacks (py-spy)
        while time.monotonic() < deadline and not store.has("end"):
            time.sleep(0.2)
    except (RuntimeError, OSError):
        pass  # the store went with its rank: the report is done or can not be
    sys.stderr.write(f"[lightning_anyaccel] rank {rank}: {reporter} reported a stall of the job with every rank's"
                     " stack it reached (this one's too); ending this rank and its child processes.\n")
    sys.stderr.flush()
    _kill_tree(os.getpid())
    os._exit(EXIT_CODE)


def _claim(rank: int, directory: Path, bound: float) -> _JobStore | None:
    """Claim the report for the job (the store) or this host (a file); end this rank where another reports.

    Returns the store to collect the other ranks' stacks from, ``None`` without one.
    """
    store = _store if _store is not None and _store.connect() else None
    if store is not None:
        try:
            first = store.client.add(store.key("fired"), 1) == 1
            if first:
                store.client.set(store.key("reporter"), str(rank))
        except (RuntimeError, OSError):
            store = None
        else:
            if not first:
                _end_when_told(rank, store, bound)
            return store
    if not _first_reporter(directory):
        time.sleep(3 * PEER_DUMP_WAIT_S + 30)  # the reporting rank dumps this one's stack and ends it
    return None


def _collect(store: _JobStore | None, rank: int, peers: dict[int, int], bound: float) -> dict[int, tuple[str, str]]:
    """The other ranks' answers through the store within :func:`answer_wait`: rank -> (host and pid, stacks)."""
    if store is None:
        time.sleep(PEER_DUMP_WAIT_S if peers else 0)
        return {}
    answers: dict[int, tuple[str, str]] = {}
    expected = [r for r in range(store.world_size) if r != rank]
    deadline = time.monotonic() + answer_wait(bound)
    try:
        while len(answers) < len(expected) and time.monotonic() < deadline:
            for r in expected:
                if r not in answers and store.has(f"stack/{r}"):
                    who, _, stacks = store.get(f"stack/{r}").partition("\n")
                    answers[r] = (who, stacks)
            time.sleep(0.2)
    except (RuntimeError, OSError):
        pass  # the store went with its rank: report what answered
    return answers


def _report(rank: int, directory: Path, bound: float) -> None:
    """Dump, name and end (from the watchdog thread)."""
    out = sys.stderr
    store = _claim(rank, directory, bound)
    own = directory / f"rank{rank}.stack"
    own.write_text(_own_stacks())
    peers = _peers(directory)
    for pid in peers.values():
        try:
            if DUMP_SIGNAL:
                os.kill(pid, DUMP_SIGNAL)
        except OSError:
            pass
    answers = _collect(store, rank, peers, bound)
    host = socket.gethostname()
    ranks = sorted({rank, *peers, *answers, *(range(store.world_size) if store else ())})
    stacks: dict[int, str] = {rank: own.read_text()}
    who: dict[int, str] = {rank: f"pid {os.getpid()}"}
    for r in ranks:
        path = directory / f"rank{r}.stack"
        if r in answers:
            name, number = (answers[r][0].split(" ", 1) + [""])[:2]
            stacks[r], who[r] = answers[r][1], f"pid {number}" + ("" if name == host else f" on {name}")
            if r not in peers:
                path.write_text(stacks[r])
        elif r != rank:
            stacks[r] = path.read_text() if r in peers and path.exists() else ""
            who[r] = f"pid {peers[r]}" if r in peers else "no pid known"
    places = {r: where(main_thread_stack(stacks[r])) if stacks[r].strip() else "(no stack: it did not answer)"
              for r in ranks}
    waiting = [r for r, place in places.items() if place.startswith("in ") and "DataLoader" not in place]
    others = [r for r in places if r not in waiting]
    reached = "every rank of the job it reached" if store else "every rank of this host"
    lines = [f"[lightning_anyaccel] rank {rank} made no progress (no training step, no collective) for {bound:.0f} s"
             f" (stall_timeout / ${STALL_TIMEOUT_ENV}); stacks of {reached} follow and are in {directory}."]
    for r in ranks:
        suffix = f", waiting for rank {', '.join(map(str, others))}" if r in waiting and others else ""
        lines.append(f"[lightning_anyaccel]   rank {r} ({who[r]}): {places[r]}{suffix}")
    out.write("\n".join(lines) + "\n")
    for r in ranks:
        if not stacks[r].strip():
            continue
        out.write(f"--- rank {r} Python stacks ({directory / f'rank{r}.stack'}) ---\n{stacks[r]}")
        native = _native(peers.get(r, os.getpid())) if r == rank or r in peers else ""
        if native:
            out.write(f"--- rank {r} native stack (py-spy) ---\n{native}")
    out.write(f"[lightning_anyaccel] rank {rank}: ending the job (the ranks above and their child processes).\n")
    out.flush()
    if store is not None:
        try:
            store.client.set(store.key("end"), "1")  # the ranks of other hosts end themselves
        except (RuntimeError, OSError):
            pass
    _kill_tree(os.getpid())
    for pid in peers.values():
        _kill_tree(pid)
    os._exit(EXIT_CODE)


def _watch(rank: int, directory: Path, bound: float, period: float) -> None:
    seen, since = _counter[0], time.monotonic()
    while True:
        time.sleep(period)
        if _store is not None and _armed.is_set() and _told(_store):
            _end_when_told(rank, _store, bound)
        if _counter[0] != seen or not _armed.is_set():
            seen, since = _counter[0], time.monotonic()
        elif time.monotonic() - since >= bound:
            try:
                _report(rank, directory, bound)
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
        _store = _JobStore(store, world_size) if store is not None and world_size > 1 else None
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
