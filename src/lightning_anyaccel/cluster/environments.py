"""Cluster environments for jobs whose processes an MPI launcher started.

:class:`AnyMPIEnvironment` replaces Lightning's ``MPIEnvironment`` for ``mpiexec``/``mpirun``
jobs (Open MPI, MPICH/Hydra, Intel MPI, Cray PALS on Aurora, MVAPICH, PMI): it reads ranks
from the launcher's variables (:mod:`lightning_anyaccel.cluster.launch_layout`), needs no ``mpi4py``, and
derives the node from the number of processes per node, so it also works when several
"nodes" share a host. ``AnyDDPStrategy`` switches to it by itself when it finds launcher
variables and Lightning chose its generic environment.

Example:
    >>> import os
    >>> AnyMPIEnvironment.detect() == any(v.rank in os.environ for v in LAUNCHERS)
    True
"""

from __future__ import annotations

import os

from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from typing_extensions import override

from lightning_anyaccel.cluster.launch_layout import (
    LAUNCHERS,
    LaunchLayoutError,
    ProcessLayout,
    detect_launcher,
    read_layout,
)

#: Port used when ``MASTER_PORT`` is not set (all ranks must agree without talking first).
DEFAULT_MAIN_PORT = 29500


class AnyMPIEnvironment(ClusterEnvironment):
    """Ranks, node and main address of a job started by an MPI launcher, without ``mpi4py``.

    The main address is ``MASTER_ADDR`` (e.g. ``export MASTER_ADDR=$(head -n1 $PBS_NODEFILE)``);
    it may be left unset only when the whole job runs on one node. The port is ``MASTER_PORT``,
    else 29500.
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
        if self._world_size is not None and self._world_size == self._layout.local_size:
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
        if self._world_size is None:
            raise LaunchLayoutError(
                f"{self._layout.launcher} does not say how many processes the job has; it is known once the"
                " strategy sets devices x num_nodes."
            )
        return self._world_size

    @override
    def set_world_size(self, size: int) -> None:
        """Accept the strategy's ``devices x num_nodes`` only when the launcher did not give a size."""
        if self._world_size is None:
            self._world_size = size

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
        if self._world_size is not None and self._world_size != expected:
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


__all__ = ["DEFAULT_MAIN_PORT", "LAUNCHERS", "AnyMPIEnvironment"]
