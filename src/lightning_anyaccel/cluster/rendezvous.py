"""Guards that make a multi-node job fail loudly instead of hanging.

- :data:`DEFAULT_TIMEOUT` (10 min) replaces Lightning's 30 min for rendezvous and collectives.
- :func:`check_layout` refuses a node rank, rank or world size that cannot form the job, before
  any process tries to connect.
- :class:`Deadline` ends a process whose rendezvous is stuck in C code that ignores the timeout
  (a ``MASTER_PORT`` owned by a server that accepts and never answers).

The network interface gloo binds to is named in :mod:`lightning_anyaccel.cluster.gloo_interface`; a worker
whose launching process died ends itself (:func:`lightning_anyaccel.cluster.supervision.watch_parent`).

Example:
    >>> check_layout(num_nodes=2, num_processes=2, node_rank=1, local_rank=1)
    >>> check_layout(num_nodes=2, num_processes=2, node_rank=2, local_rank=0)
    Traceback (most recent call last):
    ...
    lightning_anyaccel.cluster.launch_layout.LaunchLayoutError: NODE_RANK=2 but the job has num_nodes=2 (node ranks 0..1). ...
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from datetime import timedelta
from types import TracebackType

from lightning_anyaccel.cluster import supervision
from lightning_anyaccel.cluster.launch_layout import LaunchLayoutError

#: Default for ``AnyDDPStrategy(timeout=...)``: how long a rank waits for the others at the
#: rendezvous and in any collective. Lightning's (and torch's gloo) default is 30 min; we use
#: torch's NCCL default of 10 min: long enough for rank-0-only work between collectives
#: (writing a large checkpoint to a shared file system, first-step graph compilation), short
#: enough that a dead or frozen node costs minutes, not half an hour of the whole allocation.
DEFAULT_TIMEOUT = timedelta(minutes=10)

#: Overrides the default timeout (seconds) without code changes, e.g. in a batch script.
TIMEOUT_ENV = "LIGHTNING_ANYACCEL_TIMEOUT"

#: Extra seconds the rendezvous :class:`Deadline` grants after the timeout, so that torch's own
#: error (which says e.g. how many clients joined) is raised first when torch can raise at all.
RENDEZVOUS_GRACE_S = 5.0


def default_timeout(environ: Mapping[str, str] = os.environ) -> timedelta:
    """:data:`DEFAULT_TIMEOUT`, or ``$LIGHTNING_ANYACCEL_TIMEOUT`` seconds when set.

    >>> default_timeout({"LIGHTNING_ANYACCEL_TIMEOUT": "90"})
    datetime.timedelta(seconds=90)
    """
    value = environ.get(TIMEOUT_ENV)
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} is not a number of seconds.") from None
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENV}={value!r} must be positive.")
    return timedelta(seconds=seconds)


def check_layout(
    *,
    num_nodes: int,
    num_processes: int,
    node_rank: int,
    local_rank: int,
    world_size: int | None = None,
    global_rank: int | None = None,
) -> None:
    """Refuse ranks and sizes that cannot form a ``num_nodes x num_processes`` job.

    ``world_size``/``global_rank`` are what the environment reports (a launcher's ``WORLD_SIZE``,
    ``RANK``); ``None`` when the strategy computes them itself.

    Raises:
        LaunchLayoutError: naming the variable and the value that would work.
    """
    expected = num_nodes * num_processes
    if not 0 <= node_rank < num_nodes:
        raise LaunchLayoutError(
            f"NODE_RANK={node_rank} but the job has num_nodes={num_nodes} (node ranks 0..{num_nodes - 1})."
            " Give every node a distinct NODE_RANK below num_nodes, and the same num_nodes everywhere."
        )
    if not 0 <= local_rank < num_processes:
        raise LaunchLayoutError(
            f"LOCAL_RANK={local_rank} but devices={num_processes} per node (local ranks 0..{num_processes - 1})."
        )
    if world_size is not None and world_size != expected:
        raise LaunchLayoutError(
            f"WORLD_SIZE={world_size} does not match devices x num_nodes = {num_processes} x {num_nodes} = {expected}."
            " Set WORLD_SIZE to that product (or unset it), or change devices/num_nodes to match the launcher."
        )
    if global_rank is not None and not 0 <= global_rank < expected:
        raise LaunchLayoutError(f"RANK={global_rank} is outside the job's {expected} processes.")


class Deadline:
    """Context manager: end the process (:func:`~lightning_anyaccel.cluster.supervision.end_process`) if the block runs past ``seconds``.

    For blocking calls that may never return and cannot be interrupted from Python (a TCP
    handshake with a server that never answers). The message says what was being waited for.
    """

    def __init__(self, seconds: float, message: str) -> None:
        self.seconds = seconds
        self.message = message
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="anyaccel-deadline", daemon=True)

    def _watch(self) -> None:
        if not self._done.wait(self.seconds):
            supervision.end_process(f"{self.message} (gave up after {self.seconds:.0f} s)")

    def __enter__(self) -> Deadline:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()
        self._thread.join(5.0)  # gone before the caller goes on to fork (CPython gh-112275: a thread ending during a fork)


__all__ = ["DEFAULT_TIMEOUT", "RENDEZVOUS_GRACE_S", "TIMEOUT_ENV", "Deadline", "check_layout", "default_timeout"]
