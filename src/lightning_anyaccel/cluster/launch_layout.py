"""What each MPI-style launcher tells its processes: the one table of launcher variables.

``mpiexec``/``mpirun`` and Cray's PALS start every process themselves and describe its place in
the job through environment variables whose names differ per implementation. Lightning's own
``MPIEnvironment`` ignores them, needs ``mpi4py`` and derives the node from host names (two
"nodes" on one host then crash). :class:`~lightning_anyaccel.cluster.environments.AnyMPIEnvironment`
reads the variables below instead; this table is the only place that names them, and the
documentation's launcher table is written from it.

Example:
    >>> layout = read_layout({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    >>> (layout.launcher, layout.rank, layout.node_rank, layout.local_rank)
    ('MPICH / Hydra (also Intel MPI)', 3, 1, 1)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lightning_anyaccel.troubleshooting import LinkedError


@dataclass(frozen=True)
class LauncherVariables:
    """The environment variables one launcher family sets in every process it starts.

    Attributes:
        name: the launcher family, for messages and docs.
        rank: the process's global rank.
        local_rank: the process's rank among the processes on its node.
        local_size: how many processes the launcher put on this node.
        size: candidates for the job's total number of processes, first present wins; empty
            when the launcher sets none (the world size then comes from ``devices x num_nodes``).
        example: how such a job is started, for the docs.
    """

    name: str
    rank: str
    local_rank: str
    local_size: str
    size: tuple[str, ...]
    example: str = ""

    @property
    def variables(self) -> tuple[str, ...]:
        """Every variable this launcher sets that we read."""
        return (self.rank, *self.size, self.local_rank, self.local_size)


#: Launcher families in detection order (the first whose rank and local-rank variables are both
#: set wins). Cray PALS comes before plain PMI because Cray's PMI sets ``PMI_RANK`` as well.
LAUNCHERS: tuple[LauncherVariables, ...] = (
    LauncherVariables(
        name="Open MPI",
        rank="OMPI_COMM_WORLD_RANK",
        local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
        local_size="OMPI_COMM_WORLD_LOCAL_SIZE",
        size=("OMPI_COMM_WORLD_SIZE",),
        example="mpirun -n 4 --npernode 2 python train.py",
    ),
    LauncherVariables(
        name="Cray PALS (Aurora, Polaris)",
        rank="PALS_RANKID",
        local_rank="PALS_LOCAL_RANKID",
        local_size="PALS_LOCAL_SIZE",
        size=("PALS_SIZE", "PMI_SIZE"),
        example="mpiexec -n 24 --ppn 12 python train.py",
    ),
    LauncherVariables(
        name="MVAPICH",
        rank="MV2_COMM_WORLD_RANK",
        local_rank="MV2_COMM_WORLD_LOCAL_RANK",
        local_size="MV2_COMM_WORLD_LOCAL_SIZE",
        size=("MV2_COMM_WORLD_SIZE",),
        example="mpirun_rsh -np 4 ... python train.py",
    ),
    LauncherVariables(
        name="MPICH / Hydra (also Intel MPI)",
        rank="PMI_RANK",
        local_rank="MPI_LOCALRANKID",
        local_size="MPI_LOCALNRANKS",
        size=("PMI_SIZE",),
        example="mpiexec -n 4 -ppn 2 -hosts node0,node1 python train.py",
    ),
    LauncherVariables(
        name="PMI (Cray PMI, Slurm PMI2)",
        rank="PMI_RANK",
        local_rank="PMI_LOCAL_RANK",
        local_size="PMI_LOCAL_SIZE",
        size=("PMI_SIZE",),
        example="srun --mpi=pmi2 ... python train.py",
    ),
)


class LaunchLayoutError(LinkedError, ValueError):
    """The launcher's variables (or the Trainer's settings) do not describe a consistent job."""


@dataclass(frozen=True)
class ProcessLayout:
    """Where one process sits in the job, as its launcher described it.

    ``node_rank`` is ``rank // local_size``: launchers place ranks on nodes in blocks by
    default, and this works when several "nodes" share one host (host names would not).
    """

    launcher: str
    rank: int
    local_rank: int
    local_size: int
    world_size: int | None

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_size


def detect_launcher(environ: Mapping[str, str]) -> LauncherVariables | None:
    """The first launcher of :data:`LAUNCHERS` whose rank and local-rank variables are set."""
    for launcher in LAUNCHERS:
        if launcher.rank in environ and launcher.local_rank in environ:
            return launcher
    return None


def _int(environ: Mapping[str, str], name: str, launcher: str) -> int:
    value = environ.get(name)
    if value is None:
        raise LaunchLayoutError(f"{launcher} set some of its variables but not {name}; cannot place this process.")
    try:
        return int(value)
    except ValueError:
        raise LaunchLayoutError(f"{name}={value!r} (set by {launcher}) is not an integer.") from None


def read_layout(environ: Mapping[str, str]) -> ProcessLayout:
    """Read and check this process's place in the job from the launcher's variables.

    Raises:
        LaunchLayoutError: no known launcher variables, a missing or non-integer one, or
            values that contradict each other (rank outside the world, local rank outside the
            node, ranks not placed on nodes in blocks).
    """
    launcher = detect_launcher(environ)
    if launcher is None:
        known = "; ".join(f"{item.name}: {item.rank}/{item.local_rank}" for item in LAUNCHERS)
        raise LaunchLayoutError(f"No MPI launcher variables found in the environment (looked for {known}).")
    name = launcher.name
    rank = _int(environ, launcher.rank, name)
    local_rank = _int(environ, launcher.local_rank, name)
    local_size = _int(environ, launcher.local_size, name)
    world_size = next((_int(environ, var, name) for var in launcher.size if var in environ), None)
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise LaunchLayoutError(
            f"{name}: local rank {local_rank} ({launcher.local_rank}) is not within the node's"
            f" {local_size} processes ({launcher.local_size})."
        )
    if world_size is not None and not 0 <= rank < world_size:
        raise LaunchLayoutError(f"{name}: rank {rank} ({launcher.rank}) is not within the world size {world_size}.")
    if world_size is not None and world_size % local_size:
        raise LaunchLayoutError(
            f"{name}: {world_size} processes cannot fill nodes of {local_size} each; start the same number of"
            " processes on every node (e.g. `--ppn`/`--npernode`)."
        )
    if rank % local_size != local_rank:
        raise LaunchLayoutError(
            f"{name}: rank {rank} has local rank {local_rank}, but with {local_size} processes per node block"
            f" placement gives {rank % local_size}. Place ranks on nodes in blocks (the default; not"
            " `--map-by node`/round-robin), so that node rank = rank // processes per node."
        )
    return ProcessLayout(launcher=name, rank=rank, local_rank=local_rank, local_size=local_size, world_size=world_size)


__all__ = ["LAUNCHERS", "LaunchLayoutError", "LauncherVariables", "ProcessLayout", "detect_launcher", "read_layout"]
