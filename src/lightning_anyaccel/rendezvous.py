"""Guards that make a multi-node job fail loudly instead of hanging.

- :data:`DEFAULT_TIMEOUT` (10 min) replaces Lightning's 30 min for rendezvous and collectives.
- :func:`check_layout` refuses a node rank, rank or world size that cannot form the job, before
  any process tries to connect.
- :func:`configure_socket_interface` names the network interface gloo must use when the main
  address is not loopback: gloo otherwise binds to the address the host name resolves to,
  often ``127.0.0.1``, and the job hangs until a timeout.
- :class:`Deadline` ends a process whose rendezvous is stuck in C code that ignores the timeout
  (a ``MASTER_PORT`` owned by a server that accepts and never answers).
- :func:`watch_parent` ends a worker whose launching process died, so no orphan outlives the job.

Example:
    >>> check_layout(num_nodes=2, num_processes=2, node_rank=1, local_rank=1)
    >>> check_layout(num_nodes=2, num_processes=2, node_rank=2, local_rank=0)
    Traceback (most recent call last):
    ...
    lightning_anyaccel.launch_layout.LaunchLayoutError: NODE_RANK=2 but the job has num_nodes=2 (node ranks 0..1). ...
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

import psutil

from lightning_anyaccel import _lightning
from lightning_anyaccel.launch_layout import LaunchLayoutError

log = logging.getLogger(__name__)

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

#: Exit status of a process ended by a :class:`Deadline` or :func:`watch_parent`.
EXIT_CODE = 3

#: The interface variable gloo reads. NCCL, HCCL and oneCCL pick a non-loopback interface by
#: themselves; their variables are listed in the docs' troubleshooting section.
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"


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


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or host name) resolves to a loopback address.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost")
    (True, True)
    """
    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def interface_towards(address: str) -> str | None:
    """The name of the local interface the kernel would use to reach ``address``.

    A UDP ``connect`` only consults the routing table (no packet is sent); the local address
    it picks is then looked up among the interfaces.
    """
    try:
        target = socket.gethostbyname(address)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            local = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(item.family == socket.AF_INET and item.address == local for item in addresses):
            return name
    return None


def configure_socket_interface(main_address: str, environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` to the interface that reaches ``main_address``, unless set already.

    Returns the interface chosen (``None`` when nothing was changed: variable already set,
    loopback main address, or no interface found).
    """
    if environ.get(GLOO_SOCKET_IFNAME) or is_loopback(main_address):
        return None
    name = interface_towards(main_address)
    if name is None:
        log.warning(
            "Could not find the interface that reaches MASTER_ADDR=%s; if the job hangs at the rendezvous,"
            " set %s to it.", main_address, GLOO_SOCKET_IFNAME,
        )
        return None
    environ[GLOO_SOCKET_IFNAME] = name
    log.info("Using network interface %s (towards MASTER_ADDR=%s) for gloo.", name, main_address)
    return name


def _die(message: str) -> None:
    """Print ``message`` and end the process now, from any thread (the main one may be stuck in C)."""
    try:
        sys.stderr.write(f"\n[lightning_anyaccel] {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_CODE)


class Deadline:
    """Context manager: end the process with :data:`EXIT_CODE` if the block runs past ``seconds``.

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
            _die(f"{self.message} (gave up after {self.seconds:.0f} s)")

    def __enter__(self) -> Deadline:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._done.set()


def watch_parent(parent_pid: int, rank: int, period_s: float = 0.5) -> threading.Thread | None:
    """End this process when ``parent_pid`` (the launching process) is no longer its parent.

    Returns the watching thread, or ``None`` when ``parent_pid`` is not our parent (nothing to watch).
    """
    if os.getppid() != parent_pid:
        return None

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period_s)
        _die(f"rank {rank}: the process that launched this one (pid {parent_pid}) died; exiting so no orphan is left.")

    thread = threading.Thread(target=watch, name="anyaccel-parent-watch", daemon=True)
    thread.start()
    return thread


def bound_deepspeed_groups(timeout: timedelta) -> bool:
    """Make the process groups DeepSpeed creates itself time out after ``timeout`` too.

    ``deepspeed.init_distributed(timeout=...)`` bounds only the default group. ZeRO then
    all-reduces over groups it makes with ``torch.distributed.new_group(ranks)`` (a clone of
    the world group, data-parallel groups), which get torch's default: 30 minutes on gloo.
    A frozen rank then holds the job for half an hour whatever the strategy's ``timeout``.
    Call after DeepSpeed's ``init_distributed``; returns whether DeepSpeed's backend was patched.
    """
    return _lightning.bound_deepspeed_new_group(timeout)


__all__ = [
    "DEFAULT_TIMEOUT",
    "bound_deepspeed_groups",
    "EXIT_CODE",
    "GLOO_SOCKET_IFNAME",
    "RENDEZVOUS_GRACE_S",
    "TIMEOUT_ENV",
    "Deadline",
    "check_layout",
    "configure_socket_interface",
    "default_timeout",
    "interface_towards",
    "is_loopback",
    "watch_parent",
]
