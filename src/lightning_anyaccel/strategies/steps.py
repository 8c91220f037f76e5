"""The setup steps of the package's strategies, and the one function that runs them.

Every strategy family (:mod:`~lightning_anyaccel.strategies.single`, ``.ddp``, ``.fsdp``,
``.model_parallel``, ``.deepspeed``) declares its setup as one ordered tuple of :class:`Step`
(``SETUP`` in the family's module). :func:`run_setup` runs it, in two places only:

- in the process that starts the workers, before any starts (``_configure_launcher``): the steps
  marked :func:`before_launch`, which need neither the device nor the other processes, so that a
  mistake is reported once, by the launching process;
- in every worker (``setup_environment``): all the steps, in order.

A step is a plain function of the strategy, typed against the protocol of what it may use
(:class:`SetupTarget`, :class:`DistributedTarget`, :class:`ShardedTarget`): public members only,
the front-end adapter (:mod:`lightning_anyaccel.front_ends`) and the contract's accessors
(:mod:`lightning_anyaccel._lightning`). No step is reached through ``super()``: to know what a
strategy does at setup, read its family's ``SETUP``. What every multi-process family does alike
is written once here and composed into each family's list: :func:`launch_checks` (before any
worker starts), :data:`BEFORE_JOIN` and :data:`AFTER_JOIN` (around joining the process group).

Example:
    >>> steps = (before_launch(check_accelerator), in_worker(lightning_setup))
    >>> [step.name for step in steps if step.before_launch]
    ['check_accelerator']
    >>> [step.name for step in launch_checks()]  # doctest: +NORMALIZE_WHITESPACE
    ['supervise_worker', 'check_accelerator', 'align_precision', 'check_start_method', 'check_fork_safety',
     'prepare_backend']
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.multiprocessing as mp

from lightning_anyaccel import _lightning
from lightning_anyaccel.accelerator import DeviceTypeError
from lightning_anyaccel.cluster import gloo_interface, rendezvous, supervision, watchdog
from lightning_anyaccel.device import distributed
from lightning_anyaccel.device.devices import DeviceSpec, get_spec
from lightning_anyaccel.device.distributed import check_fork_safe
from lightning_anyaccel.device.precision import align_precision_plugin, check_device_supports
from lightning_anyaccel.front_ends import FrontEnd
from lightning_anyaccel.strategies.errors import NotebookLaunchError, ShardingNotSupportedError
from lightning_anyaccel.strategies.support import has_collectives


class SetupTarget(Protocol):
    """What a step of every strategy may use of it (:class:`~lightning_anyaccel.strategies.base.AnyStrategyMixin`)."""

    accelerator: Any

    @property
    def strategy_name(self) -> str:
        """The name the strategy registers under (for messages)."""
        ...

    @property
    def root_device(self) -> torch.device:
        """The device of this process."""
        ...

    @property
    def device_type(self) -> str:
        """The device type the strategy trains on."""
        ...

    @property
    def side(self) -> FrontEnd:
        """The front-end adapter (Trainer or Fabric)."""
        ...

    def lightning_setup_environment(self) -> None:
        """Lightning's own ``setup_environment`` (select the device, join the process group)."""
        ...


class DistributedTarget(SetupTarget, Protocol):
    """What a step of a multi-process strategy may use of it (:class:`~.multi_process.AnyDistributedMixin`)."""

    #: The collective backend :func:`prepare_backend` resolved (``None`` before it ran).
    resolved_backend: str | None

    @property
    def cluster_environment(self) -> Any:
        """Lightning's cluster environment (ranks, main address and port)."""
        ...

    @property
    def num_nodes(self) -> int:
        """How many nodes the job runs on."""
        ...

    @property
    def num_processes(self) -> int:
        """How many processes run on each node."""
        ...

    @property
    def node_rank(self) -> int:
        """This node's rank."""
        ...

    @property
    def local_rank(self) -> int:
        """This process's rank on its node."""
        ...

    @property
    def global_rank(self) -> int:
        """This process's rank in the job."""
        ...

    @property
    def world_size(self) -> int:
        """How many processes the job has."""
        ...

    @property
    def timeout(self) -> timedelta:
        """How long any rank waits for the others."""
        ...


class ShardedTarget(DistributedTarget, Protocol):
    """What a step of a sharded strategy may use of it (:class:`~.sharded.AnyShardedMixin`)."""

    sharding_name: str

    @property
    def spec(self) -> DeviceSpec:
        """The device type's entry of the device table."""
        ...


#: A setup step: a function of the strategy (typed against one of the protocols above).
StepFunction = Callable[[Any], None]


@dataclass(frozen=True)
class Step:
    """One step of a strategy's setup.

    Args:
        run: the step, a function of the strategy.
        before_launch: also run it in the launching process, before any worker starts.
    """

    run: StepFunction
    before_launch: bool = False

    @property
    def name(self) -> str:
        """The step's function name (what the docs and the error messages call it)."""
        return self.run.__name__


#: A strategy's setup: its steps, in order.
Setup = tuple[Step, ...]


def before_launch(run: StepFunction) -> Step:
    """A step of the launching process and of every worker (checks that need no device and no peer)."""
    return Step(run, before_launch=True)


def in_worker(run: StepFunction) -> Step:
    """A step of the workers only (it needs the device or the other processes)."""
    return Step(run, before_launch=False)


def run_setup(strategy: SetupTarget, setup: Setup, *, launching: bool) -> None:
    """Run ``setup`` on ``strategy``: the :func:`before_launch` steps when ``launching``, else every step."""
    for step in setup:
        if step.before_launch or not launching:
            step.run(strategy)


# ----- steps of every strategy --------------------------------------------------------------------


def check_accelerator(strategy: SetupTarget) -> None:
    """Refuse an accelerator of another device type than the strategy's devices (:class:`DeviceTypeError`)."""
    accelerator_type = getattr(strategy.accelerator, "device_type", None)
    if accelerator_type is not None and accelerator_type != strategy.device_type:
        raise DeviceTypeError(
            f"{type(strategy).__name__} runs on {strategy.root_device}, but the accelerator is {strategy.accelerator!r}."
            " Leave the strategy's devices unset: it takes them from the accelerator."
        )


def align_precision(strategy: SetupTarget) -> None:
    """Rebuild a mixed-precision plugin made for another device type (Lightning picks ``cuda``)."""
    side = strategy.side
    plugin = side.precision_plugin(strategy)
    aligned = align_precision_plugin(plugin, strategy.device_type)
    if aligned is not plugin:
        side.set_precision_plugin(strategy, aligned)


def lightning_setup(strategy: SetupTarget) -> None:
    """Lightning's own ``setup_environment``: select the device, join the process group."""
    strategy.lightning_setup_environment()


def check_device_precision(strategy: SetupTarget) -> None:
    """Ask the device (in the worker, after ``setup_device``) whether it can do the precision."""
    precision = getattr(strategy.side.precision_plugin(strategy), "precision", "")
    device = strategy.root_device
    check_device_supports(str(precision), get_spec(device.type), device)


# ----- steps of the multi-process strategies ------------------------------------------------------


def supervise_worker(strategy: DistributedTarget) -> None:
    """In a worker: die with the launching process (:func:`~lightning_anyaccel.cluster.supervision.supervise_worker`)."""
    supervision.supervise_worker(strategy.global_rank)


def follow_launcher(strategy: DistributedTarget) -> None:
    """In a rank started by a launcher (external or the package's): end with it, and every process the rank
    started (:func:`~lightning_anyaccel.cluster.supervision.watch_launcher`; a long-lived thread started
    once, before any DataLoader worker is forked: a thread that starts or ends during a ``fork`` is
    what CPython gh-112275 deadlocks on)."""
    env = strategy.cluster_environment
    if env.creates_processes_externally or supervision.launcher_pid() == os.getppid():
        supervision.watch_launcher(strategy.global_rank)


def watch_stalls(strategy: DistributedTarget) -> None:
    """In a rank, once in the process group: start the stall watchdog (:mod:`~lightning_anyaccel.cluster.watchdog`).

    The rendezvous before it has its own deadline; from here on a rank that makes no progress for
    ``stall_timeout`` (no batch, no backward, no collective) reports every rank's stack and ends the job.
    The ranks of every node answer through the store at the rendezvous address (``MASTER_ADDR:MASTER_PORT``).
    """
    env = strategy.cluster_environment
    job = f"{env.main_address}-{env.main_port}"
    watchdog.start(strategy.global_rank, job, getattr(strategy, "stall_timeout", None),
                   store=(env.main_address, int(env.main_port)), world_size=strategy.world_size)


def watch_stalls_alone(strategy: SetupTarget) -> None:
    """In the one process of a single-device run: start the stall watchdog (a job of its own, rank 0).

    A batch, a backward or an optimizer step is progress, as in a multi-process run. Not in a notebook or an
    interactive session: its kernel idles between cells, and interrupting it shows where it waits.
    """
    if not _lightning.is_interactive():
        watchdog.start(0, f"single-{os.getpid()}", getattr(strategy, "stall_timeout", None))


def check_start_method(strategy: DistributedTarget) -> None:
    """Say which strategy to use when the start method can not work here (notebooks, no ``fork``)."""
    method = _lightning.start_method_of(strategy)
    if method in ("fork", "forkserver") and method not in mp.get_all_start_methods():
        raise NotebookLaunchError(
            f"strategy={strategy.strategy_name!r} needs the {method!r} start method, which this platform"
            f" does not have (it has {', '.join(mp.get_all_start_methods())}). Run your code as a script with"
            " strategy='any_ddp', or use 'any_ddp_spawn'."
        )
    if _lightning.is_interactive() and method not in ("fork", "forkserver"):
        raise NotebookLaunchError(
            f"strategy={strategy.strategy_name!r} (start method {method!r}) can not run from a notebook or"
            " an interactive session: 'popen' re-runs a script and 'spawn' can not pickle functions defined"
            " there. Use strategy='any_ddp_notebook' (fork), or run your code as a script."
        )


def check_fork_safety(strategy: DistributedTarget) -> None:
    """Refuse a ``fork`` when the device was already initialised in this process."""
    if _lightning.start_method_of(strategy) in ("fork", "forkserver"):
        check_fork_safe(strategy.device_type)


def prepare_backend(strategy: DistributedTarget) -> None:
    """Resolve the collective backend once (a device without one is refused, naming ``any_single``) and ready it.

    The strategy keeps the answer (``resolved_backend``) for Lightning's process group;
    :func:`~lightning_anyaccel.device.distributed.prepare_backend` is the one place torch's backend registry changes.
    """
    strategy.resolved_backend = distributed.prepare_backend(
        strategy.root_device, _lightning.process_group_backend_given(strategy))


def check_layout(strategy: DistributedTarget) -> None:
    """Set the ranks from the cluster environment and refuse an inconsistent process layout."""
    env = strategy.cluster_environment
    strategy.side.set_world_ranks(strategy)
    rendezvous.check_layout(
        num_nodes=strategy.num_nodes,
        num_processes=strategy.num_processes,
        node_rank=strategy.node_rank,
        local_rank=strategy.local_rank,
        world_size=env.world_size(),
        global_rank=env.global_rank(),
    )


def name_socket_interface(strategy: DistributedTarget) -> None:
    """Name gloo's network interface towards the main address (:func:`~lightning_anyaccel.cluster.gloo_interface.configure_socket_interface`)."""
    gloo_interface.configure_socket_interface(strategy.cluster_environment.main_address)


def rendezvous_deadline(strategy: DistributedTarget) -> rendezvous.Deadline:
    """A deadline that ends the process with a message if the rendezvous outlives ``timeout`` (plus a grace)."""
    env = strategy.cluster_environment
    seconds = strategy.timeout.total_seconds() + rendezvous.RENDEZVOUS_GRACE_S
    message = (
        f"rank {env.global_rank()}/{env.world_size()}: the rendezvous at {env.main_address}:{env.main_port} did"
        f" not complete. Check that all {strategy.num_nodes} node(s) started with the same MASTER_ADDR/MASTER_PORT"
        " and distinct NODE_RANKs, that the port is not used by another program, and that no firewall blocks it"
    )
    return rendezvous.Deadline(seconds, message)


def lightning_setup_within_deadline(strategy: DistributedTarget) -> None:
    """Lightning's own ``setup_environment`` (select the device, join the process group) within the deadline."""
    with rendezvous_deadline(strategy):
        strategy.lightning_setup_environment()


def destroy_process_group_at_exit(strategy: DistributedTarget) -> None:
    """Destroy the process group at exit for every backend (Lightning does it for NCCL only)."""
    atexit.register(_lightning.destroy_process_group)


# ----- what every multi-process family does alike, composed into each family's SETUP ----------------


def launch_checks(align: StepFunction = align_precision) -> Setup:
    """The steps every multi-process strategy runs before any worker starts (and again in each), in order.

    Args:
        align: the step that fits the precision plugin to the device type (FSDP has its own).
    """
    return (
        before_launch(supervise_worker),  # a worker dies with its launching process
        before_launch(check_accelerator),
        before_launch(align),
        before_launch(check_start_method),
        before_launch(check_fork_safety),
        before_launch(prepare_backend),
    )


#: In a worker, before joining the process group: the ranks and the layout checked, gloo's interface named,
#: the launcher followed.
BEFORE_JOIN: Setup = (in_worker(check_layout), in_worker(name_socket_interface), in_worker(follow_launcher))

#: In a worker, once in the process group: the device asked about the precision, the exit hook registered,
#: the stall watchdog started.
AFTER_JOIN: Setup = (in_worker(check_device_precision), in_worker(destroy_process_group_at_exit),
                     in_worker(watch_stalls))


def with_launch_check(setup: Setup, run: StepFunction) -> Setup:
    """``setup`` with ``run`` as its last :func:`before_launch` step (a front end's own check).

    >>> [step.name for step in with_launch_check(AFTER_JOIN, check_accelerator)]
    ['check_accelerator', 'check_device_precision', 'destroy_process_group_at_exit', 'watch_stalls']
    """
    launching = tuple(step for step in setup if step.before_launch)
    return (*launching, before_launch(run), *(step for step in setup if not step.before_launch))


# ----- steps of the sharded strategies ------------------------------------------------------------


def check_collectives(strategy: ShardedTarget) -> None:
    """Refuse devices without collectives (e.g. ``mps``): sharding splits the model across processes."""
    spec = strategy.spec
    if not has_collectives(spec):  # the pages ask the same (lightning_anyaccel.strategies.support)
        raise ShardingNotSupportedError(
            f"{strategy.sharding_name} splits the model across processes, but {spec.name}"
            f" ({strategy.device_type!r}) has no collective backend and runs one device per machine."
            " Use strategy='any_single' there, or a device type with several devices."
        )


__all__ = [
    "AFTER_JOIN",
    "BEFORE_JOIN",
    "DistributedTarget",
    "Setup",
    "SetupTarget",
    "ShardedTarget",
    "Step",
    "StepFunction",
    "align_precision",
    "before_launch",
    "check_accelerator",
    "check_collectives",
    "check_device_precision",
    "check_fork_safety",
    "check_layout",
    "check_start_method",
    "destroy_process_group_at_exit",
    "follow_launcher",
    "in_worker",
    "launch_checks",
    "lightning_setup",
    "lightning_setup_within_deadline",
    "rendezvous_deadline",
    "name_socket_interface",
    "prepare_backend",
    "run_setup",
    "supervise_worker",
    "watch_stalls",
    "watch_stalls_alone",
    "with_launch_check",
]
