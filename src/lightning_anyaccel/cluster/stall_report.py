"""What the stall watchdog does once a rank made no progress: reach every rank, say where each was, end the job.

:mod:`~lightning_anyaccel.cluster.watchdog` counts progress and notices the stall; this module does what
follows (the watchdog's steps 2 to 4): :func:`report` claims the report (in the job's c10d store, else per
host with a file), asks the other ranks for their stacks (through the store, and with :data:`DUMP_SIGNAL`
on this host), says where each waited (:func:`where`) and ends the ranks and their child processes; a rank
that another one told through the store posts its stacks and ends itself (:func:`end_when_told`).

Example:
    >>> where(['  File "/x/torch/distributed/distributed_c10d.py", line 1, in all_reduce'])
    'in all_reduce'
    >>> answer_wait(60.0)
    14.0
"""

from __future__ import annotations

import faulthandler
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning_anyaccel.cluster import supervision

#: Exit status of a rank ended by the watchdog.
EXIT_CODE = 4
#: Seconds the stalled rank waits for the other ranks' stacks, at least (see :func:`answer_wait`).
PEER_DUMP_WAIT_S = 2.0
#: Where the watchdog's keys live in the job's store (a torchrun restart gets fresh ones).
STORE_PREFIX = "lightning_anyaccel/stall"

#: The signal that makes a rank write its stacks: a real-time one, so that ``SIGUSR1`` stays free for
#: preemption warnings (SLURM's ``--signal=USR1``, :class:`~lightning_anyaccel.checkpoints.preemption.PreemptionCheckpoint`).
DUMP_SIGNAL: int = int(getattr(signal, "SIGRTMIN", 0)) + 7 if hasattr(signal, "SIGRTMIN") else 0

_COLLECTIVE = re.compile(r'torch/distributed/distributed_c10d\.py", line \d+,? in (\w+)')
_FRAME = re.compile(r'\s*File "([^"]+)", line (\d+)(?:,? in (\S+))?')
_LIBRARY = ("/torch/", "/lightning/", "/pytorch_lightning/", "/lightning_fabric/", "/deepspeed/", "/threading.py",
            "/multiprocessing/", "/queue.py", "/selectors.py", "/lightning_anyaccel/", "/site-packages/", "<frozen")



class JobStore:
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


def told(store: JobStore) -> bool:
    """Whether a rank of the job asked for every rank's stacks (``False`` where the store is unreachable)."""
    try:
        return store.connect() and store.has("fired")
    except (RuntimeError, OSError):
        return False


def end_when_told(rank: int, store: JobStore, bound: float) -> None:
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


def _claim(rank: int, directory: Path, bound: float, store: JobStore | None) -> JobStore | None:
    """Claim the report for the job (the store) or this host (a file); end this rank where another reports.

    Returns the store to collect the other ranks' stacks from, ``None`` without one.
    """
    store = store if store is not None and store.connect() else None
    if store is not None:
        try:
            first = store.client.add(store.key("fired"), 1) == 1
            if first:
                store.client.set(store.key("reporter"), str(rank))
        except (RuntimeError, OSError):
            store = None
        else:
            if not first:
                end_when_told(rank, store, bound)
            return store
    if not _first_reporter(directory):
        time.sleep(3 * PEER_DUMP_WAIT_S + 30)  # the reporting rank dumps this one's stack and ends it
    return None


def _collect(store: JobStore | None, rank: int, peers: dict[int, int], bound: float) -> dict[int, tuple[str, str]]:
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


def report(rank: int, directory: Path, bound: float, store: JobStore | None, why: str) -> None:
    """Dump, name and end (from the watchdog thread): ``why`` says how long the rank stalled and what set the bound.

    ``store``: the job's store (:class:`JobStore`), ``None`` for the ranks of this host only.
    """
    out = sys.stderr
    store = _claim(rank, directory, bound, store)
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
    lines = [f"[lightning_anyaccel] rank {rank} made no progress (no training step, no collective) {why};"
             f" stacks of {reached} follow and are in {directory}."]
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




__all__ = ["DUMP_SIGNAL", "EXIT_CODE", "PEER_DUMP_WAIT_S", "STORE_PREFIX", "JobStore", "answer_wait", "end_when_told",
           "main_thread_stack", "report", "tick", "told", "where"]
