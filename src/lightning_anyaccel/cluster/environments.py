"""Cluster environments for jobs whose processes an MPI launcher started.

:class:`AnyMPIEnvironment` replaces Lightning's ``MPIEnvironment`` for ``mpiexec``/``mpirun``
jobs (Open MPI, MPICH/Hydra, Intel MPI, Cray PALS on Aurora, MVAPICH, PMI): it reads ranks
from the launcher's variables (:mod:`lightning_anyaccel.cluster.launch_layout`), needs no ``mpi4py``, and
derives the node from the number of processes per node, so it also works when several
"nodes" share a host. Every multi-process strategy switches to it by itself when it finds launcher
variables and Lightning chose its generic environment, ``MPIEnvironment`` or Slurm's
(:func:`prefers_launcher`: the variables ``mpiexec`` sets in each process describe it, an inherited
``RANK`` or the batch step's ``SLURM_PROCID`` do not).

:func:`check_process_count` refuses a job whose launcher started another number of processes than
``devices x num_nodes``, for every external launcher (``torchrun``, ``srun``, ``mpiexec``, ...).

Example:
    >>> import os
    >>> AnyMPIEnvironment.detect() == any(v.rank in os.environ for v in LAUNCHERS)
    True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_anyaccel.cluster.launch_layout import (
    GENERIC_VARIABLES,
    LAUNCHERS,
    LaunchLayoutError,
    ProcessLayout,
    detect_launcher,
    disagreeing_variables,
    ignored_variables,
    read_layout,
)

log = logging.getLogger(__name__)

#: Port used when ``MASTER_PORT`` is not set (all ranks must agree without talking first).
DEFAULT_MAIN_PORT = 29500


class AnyMPIEnvironment(ClusterEnvironment):
    """Ranks, node and main address of a job started by an MPI launcher, without ``mpi4py``.

    The main address is ``MASTER_ADDR`` (e.g. ``export MASTER_ADDR=$(head -n1 $PBS_NODEFILE)``),
    else the first node of a Slurm allocation (``SLURM_NODELIST``); it may be left unset only when
    the whole job runs on one node. The port is ``MASTER_PORT``, else 29500.
    Variables of other launchers that disagree with this launcher's (an inherited ``RANK=0``) are
    ignored (:func:`warn_ignored_variables` names them).
    """

    def __init__(self) -> None:
        super().__init__()
        self._layout: ProcessLayout = read_layout(os.environ)
        self._world_size = self._layout.world_size
        # rank_zero_only reads its `rank` attribute, set like Lightning's own environments set it
        rank_zero_only.rank = self._layout.rank  # type: ignore[attr-defined]  # an attribute set on the function

    @property
    def layout(self) -> ProcessLayout:
        """What the launcher said about this process."""
        return self._layout

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True

    @property
    @override
    def main_address(self) -> str:
        address = os.environ.get("MASTER_ADDR")
        if address:
            return address
        nodes = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
        if nodes and self._world_size > self._layout.local_size:
            return SLURMEnvironment.resolve_root_node_address(nodes)
        if self._world_size == self._layout.local_size:
            return "127.0.0.1"
        raise LaunchLayoutError(
            f"{self._layout.launcher} started a job on several nodes, but MASTER_ADDR is not set. Export the"
            " first node's address before mpiexec, e.g. `export MASTER_ADDR=$(head -n1 $PBS_NODEFILE)` (PBS)"
            " or `export MASTER_ADDR=$(scontrol show hostnames | head -n1)` (Slurm), and pass it to every rank"
            " (Open MPI: `-x MASTER_ADDR`)."
        )

    @property
    @override
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", DEFAULT_MAIN_PORT))

    @staticmethod
    @override
    def detect() -> bool:
        return detect_launcher(os.environ) is not None

    @override
    def world_size(self) -> int:
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        """The launcher's size is authoritative; :func:`check_process_count` refuses another ``devices x num_nodes``."""

    @override
    def global_rank(self) -> int:
        return self._layout.rank

    @override
    def set_global_rank(self, rank: int) -> None:
        """The launcher's rank is authoritative; see :meth:`validate_settings` for mismatches."""

    @override
    def local_rank(self) -> int:
        return self._layout.local_rank

    @override
    def node_rank(self) -> int:
        return self._layout.node_rank

    @override
    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Refuse a Trainer whose ``devices``/``num_nodes`` disagree with what the launcher started.

        Called by the launcher before any process group exists, so every rank fails at once
        with the same message instead of some crashing and the rest waiting for them.
        """
        layout = self._layout
        if layout.local_size != num_devices:
            raise LaunchLayoutError(
                f"{layout.launcher} started {layout.local_size} processes on this node, but the Trainer has"
                f" devices={num_devices}. Set devices={layout.local_size}, or start {num_devices} per node"
                " (mpiexec --ppn / mpirun --npernode)."
            )
        expected = num_devices * num_nodes
        if self._world_size != expected:
            raise LaunchLayoutError(
                f"{layout.launcher} started {self._world_size} processes, but the Trainer expects"
                f" devices x num_nodes = {num_devices} x {num_nodes} = {expected}."
                f" Set num_nodes={self._world_size // num_devices}."
            )
        if layout.node_rank >= num_nodes:
            raise LaunchLayoutError(
                f"Rank {layout.rank} is on node {layout.node_rank}, but the Trainer has num_nodes={num_nodes}."
            )

    @override
    def teardown(self) -> None:
        """Nothing to undo: the launcher owns the processes and their variables."""


#: How the launcher behind each of Lightning's external environments is called in messages.
LAUNCHER_NAMES: dict[str, str] = {
    "TorchElasticEnvironment": "torchrun",
    "SLURMEnvironment": "srun",
    "LSFEnvironment": "jsrun",
    "KubeflowEnvironment": "Kubeflow",
    "MPIEnvironment": "mpiexec",
    "LightningEnvironment": "the launcher (WORLD_SIZE)",
}


def prefers_launcher(environment: ClusterEnvironment) -> bool:
    """Whether an MPI launcher's own variables describe this process better than ``environment`` does.

    True under ``mpiexec``/``mpirun``/PALS when Lightning chose its generic environment (a ``LOCAL_RANK``
    inherited from a shell), ``MPIEnvironment`` (needs ``mpi4py``, nodes from host names) or Slurm's (the
    batch step's ``SLURM_PROCID``, the same in every rank ``mpiexec`` started). ``torchrun``'s
    environment is kept: ``mpiexec`` or ``srun`` starting ``torchrun`` on each node is a job of its own.
    """
    generic = ("LightningEnvironment", "MPIEnvironment", "SLURMEnvironment")
    return type(environment).__name__ in generic and AnyMPIEnvironment.detect()


def _layout_of(environment: Any) -> ProcessLayout | None:
    """The launcher's layout of an :class:`AnyMPIEnvironment` (also its ``pytorch_lightning`` rebuild); else ``None``."""
    layout = getattr(environment, "layout", None)
    return layout if isinstance(layout, ProcessLayout) else None


#: Whether this process has warned about ignored variables (once per process).
_warned = False


def ignored_by(environment: ClusterEnvironment, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The variables of other launchers that ``environment`` overrules, each with both values.

    An MPI launcher's variables overrule an inherited ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` and Slurm's;
    Slurm's (``srun``) overrule the inherited generic ones. ``torchrun`` sets the generic ones itself.
    """
    layout = _layout_of(environment)
    if layout is not None:
        return ignored_variables(environ, layout)
    if type(environment).__name__ == "SLURMEnvironment":
        own = {"rank": ("SLURM_PROCID", environment.global_rank()), "local_rank": ("SLURM_LOCALID",
               environment.local_rank()), "world_size": ("SLURM_NTASKS", environment.world_size())}
        return disagreeing_variables(environ, "srun", own, GENERIC_VARIABLES)
    return []


def warn_ignored_variables(environment: ClusterEnvironment) -> None:
    """Warn once per process when variables of another launcher disagree with ``environment``'s (:func:`ignored_by`).

    The launcher that started this process wins: a stale ``RANK=0`` from an outer job or a shell is
    the same in every rank and would make every rank rank 0. A warning rather than an error: such
    variables are often inherited where the job script can not unset them, and they are not read.
    """
    global _warned
    ignored = [] if _warned else ignored_by(environment)
    if ignored:
        _warned = True
        log.warning(
            "[lightning_anyaccel] rank %d: %s says where this process is; these variables of another launcher"
            " (inherited from an outer job or shell) disagree and are ignored: %s. Unset them in the job script"
            " to silence this.", environment.global_rank(), launcher_name(environment), "; ".join(ignored),
        )


def launched_processes(environment: ClusterEnvironment) -> int | None:
    """How many processes an external launcher started; ``None`` when this process starts them itself.

    Lightning's generic environment under a launcher that sets ``LOCAL_RANK`` reports the size the
    strategy gave it; the launcher's is then ``WORLD_SIZE``, when set.
    """
    if not environment.creates_processes_externally:
        return None
    if type(environment).__name__ == "LightningEnvironment":
        value = os.environ.get("WORLD_SIZE")
        return int(value) if value and value.strip().isdigit() else None
    return int(environment.world_size())


def launcher_name(environment: Any) -> str:
    """The launcher behind ``environment``, for messages (``"torchrun"``, ``"srun"``, ``"Open MPI"``, ...)."""
    layout = _layout_of(environment)
    if layout is not None:
        return layout.launcher
    name = type(environment).__name__
    return LAUNCHER_NAMES.get(name, name)


def check_process_count(environment: ClusterEnvironment, *, devices: int, num_nodes: int, front_end: str) -> None:
    """Refuse a job whose launcher started another number of processes than ``devices x num_nodes``.

    Runs in every process before any process group exists, for every strategy and both front ends,
    so every rank fails at once with the same message (Lightning checks this only in the launcher of
    its DDP, and its ``ModelParallelStrategy`` never does). Then the environment's own checks
    (processes per node) run.

    Raises:
        LaunchLayoutError: naming both numbers and the settings that fit the launch.
    """
    launched = launched_processes(environment)
    if launched is not None and launched != devices * num_nodes:
        raise process_count_error(launcher_name(environment), launched, devices=devices, num_nodes=num_nodes,
                                  front_end=front_end)
    if launched is not None:
        environment.validate_settings(num_devices=devices, num_nodes=num_nodes)


def process_count_error(launcher: str, launched: int, *, devices: int, num_nodes: int, front_end: str,
                        strategy: str = "") -> LaunchLayoutError:
    """The error for ``launched`` processes where ``devices x num_nodes`` were expected, naming both and the fix.

    ``strategy``: a multi-process strategy to name in the fix (a one-process strategy can not take more devices).

    >>> print(process_count_error("torchrun", 4, devices=2, num_nodes=1, front_end="Trainer").args[0])
    torchrun launched 4 processes but Trainer(devices=2, num_nodes=1) expects 2: pass devices=4 or launch 2 per node (2 in all).
    """
    expected = devices * num_nodes
    fit = (f"devices={launched // num_nodes}" if launched % num_nodes == 0
           else f"devices and num_nodes whose product is {launched}")
    if strategy:
        fit += f" with strategy={strategy!r}"
    return LaunchLayoutError(
        f"{launcher} launched {launched} processes but {front_end}(devices={devices}, num_nodes={num_nodes})"
        f" expects {expected}: pass {fit} or launch {devices} per node ({expected} in all)."
    )


def external_process_count(environ: Mapping[str, str] = os.environ) -> tuple[str, int] | None:
    """``(launcher, processes)`` when ``torchrun`` or an MPI launcher started this process and said how many.

    For the one-process strategy, which has no cluster environment: only launchers whose variables
    are set per started process count (not a Slurm batch step's ``SLURM_NTASKS``, which a script run
    without ``srun`` inherits). ``None`` otherwise, also when the launcher gave no size.

    >>> external_process_count({"TORCHELASTIC_RUN_ID": "1", "WORLD_SIZE": "2"})
    ('torchrun', 2)
    >>> external_process_count({"PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0"}) is None
    True
    """
    size = environ.get("WORLD_SIZE", "")
    if environ.get("TORCHELASTIC_RUN_ID") and size.strip().isdigit():
        return "torchrun", int(size)
    launcher = detect_launcher(environ)
    size_var = next((var for var in launcher.size if var in environ), None) if launcher else None
    if launcher is None or size_var is None or not environ[size_var].strip().isdigit():
        return None
    return launcher.name, int(environ[size_var])


__all__ = [
    "DEFAULT_MAIN_PORT",
    "LAUNCHERS",
    "LAUNCHER_NAMES",
    "AnyMPIEnvironment",
    "check_process_count",
    "external_process_count",
    "ignored_by",
    "launched_processes",
    "launcher_name",
    "prefers_launcher",
    "process_count_error",
    "warn_ignored_variables",
]
