"""What each MPI-style launcher tells its processes: the one table of launcher variables.

``mpiexec``/``mpirun`` and Cray's PALS start every process themselves and describe its place in
the job through environment variables whose names differ per implementation. Lightning's own
``MPIEnvironment`` ignores them, needs ``mpi4py`` and derives the node from host names (two
"nodes" on one host then crash). :class:`~lightning_anyaccel.cluster.environments.AnyMPIEnvironment`
reads the variables below instead; this table is the only place that names them, and the
documentation's launcher table is written from it.

A launcher that leaves out the job's size or the node's (Cray PALS sets ``PALS_RANKID`` and
``PALS_LOCAL_RANKID``, not always a size) is asked through ``mpi4py`` when it is importable
(:func:`mpi4py_sizes`), else the sizes come from ``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` passed by the
user (``mpiexec --env WORLD_SIZE=24``); without any of them the layout is refused.
:func:`ignored_variables` names the variables of other launchers (a ``RANK=0`` inherited from an
outer job) that disagree with the launcher's own.

Example:
    >>> layout = read_layout({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    >>> (layout.launcher, layout.rank, layout.node_rank, layout.local_rank)
    ('MPICH / Hydra (also Intel MPI)', 3, 1, 1)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning_anyaccel.troubleshooting import LinkedError


@dataclass(frozen=True)
class LauncherVariables:
    """The environment variables one launcher family sets in every process it starts.

    Attributes:
        name: the launcher family, for messages and docs.
        rank: the process's global rank.
        local_rank: the process's rank among the processes on its node.
        local_size: how many processes the launcher put on this node.
        size: candidates for the job's total number of processes, first present wins; when none
            is set the size comes from :func:`mpi4py_sizes` or :data:`WORLD_SIZE_ENV`.
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


#: What the user passes when the launcher gives no job size and ``mpi4py`` is missing (``mpiexec --env``).
WORLD_SIZE_ENV = "WORLD_SIZE"
#: Likewise for the number of processes on each node.
LOCAL_SIZE_ENV = "LOCAL_WORLD_SIZE"

#: Sizes of the job and of this node: ``(world size, processes on this node)``, or ``None`` when unknown.
SizeSource = Callable[[], "tuple[int, int] | None"]


def mpi4py_sizes() -> tuple[int, int] | None:
    """``(world size, processes on this node)`` from ``mpi4py``'s ``COMM_WORLD``; ``None`` when it is not importable.

    Importing ``mpi4py.MPI`` initialises MPI, and the node's size is a collective
    (``Split_type(COMM_TYPE_SHARED)``): every rank calls it at the same point, when its cluster
    environment is created, and only when the launcher left a size out.
    """
    try:
        mpi: Any = importlib.import_module("mpi4py.MPI")
    except ImportError:
        return None
    world = mpi.COMM_WORLD
    node = world.Split_type(mpi.COMM_TYPE_SHARED)
    try:
        return int(world.Get_size()), int(node.Get_size())
    finally:
        node.Free()


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
    world_size: int

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


def read_layout(environ: Mapping[str, str], sizes: SizeSource = mpi4py_sizes) -> ProcessLayout:
    """Read and check this process's place in the job from the launcher's variables.

    Args:
        environ: the process's environment.
        sizes: asked for the job's and the node's size when the launcher sets no variable for one of
            them (:func:`mpi4py_sizes`); :data:`WORLD_SIZE_ENV`/:data:`LOCAL_SIZE_ENV` come after it.

    Raises:
        LaunchLayoutError: no known launcher variables, a missing or non-integer one, a size nothing
            gives (naming ``mpiexec --env WORLD_SIZE=<n>``), or values that contradict each other (rank
            outside the world, local rank outside the node, ranks not placed on nodes in blocks).
    """
    launcher = detect_launcher(environ)
    if launcher is None:
        known = "; ".join(f"{item.name}: {item.rank}/{item.local_rank}" for item in LAUNCHERS)
        raise LaunchLayoutError(f"No MPI launcher variables found in the environment (looked for {known}).")
    name = launcher.name
    rank = _int(environ, launcher.rank, name)
    local_rank = _int(environ, launcher.local_rank, name)
    world_var = next((var for var in launcher.size if var in environ), None)
    world_size = _int(environ, world_var, name) if world_var else None
    local_size = _int(environ, launcher.local_size, name) if launcher.local_size in environ else None
    if world_size is None or local_size is None:
        world_size, local_size = _missing_sizes(environ, launcher, world_size, local_size, sizes)
    if local_size < 1 or not 0 <= local_rank < local_size:
        raise LaunchLayoutError(
            f"{name}: local rank {local_rank} ({launcher.local_rank}) is not within the node's"
            f" {local_size} processes ({launcher.local_size})."
        )
    if not 0 <= rank < world_size:
        raise LaunchLayoutError(f"{name}: rank {rank} ({launcher.rank}) is not within the world size {world_size}.")
    if world_size % local_size:
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


def _missing_sizes(
    environ: Mapping[str, str], launcher: LauncherVariables, world_size: int | None, local_size: int | None,
    sizes: SizeSource,
) -> tuple[int, int]:
    """The sizes the launcher left out: from ``sizes`` (mpi4py), else from what the user passed, else an error."""
    asked = sizes()
    if asked is not None:
        return (world_size if world_size is not None else asked[0]), (local_size if local_size is not None else asked[1])
    if world_size is None and WORLD_SIZE_ENV in environ:
        world_size = _int(environ, WORLD_SIZE_ENV, "the user")
    if local_size is None and LOCAL_SIZE_ENV in environ:
        local_size = _int(environ, LOCAL_SIZE_ENV, "the user")
    if world_size is not None and local_size is not None:
        return world_size, local_size
    missing = [f"{what} ({' or '.join(names)})" for what, names, value in (
        ("the number of processes", launcher.size or (WORLD_SIZE_ENV,), world_size),
        ("the processes per node", (launcher.local_size,), local_size)) if value is None]
    raise LaunchLayoutError(
        f"{launcher.name} did not say {' nor '.join(missing)}, and mpi4py, which could ask MPI, is not installed."
        f" Pass the sizes to every rank, e.g. `mpiexec -n 24 --ppn 12 --env {WORLD_SIZE_ENV}=24 --env"
        f" {LOCAL_SIZE_ENV}=12 python train.py` (<n> processes in all, <ppn> per node), or install mpi4py."
    )


#: Generic variables a process may inherit from an outer launcher or shell, and what each stands for.
GENERIC_VARIABLES: dict[str, str] = {"RANK": "rank", "LOCAL_RANK": "local_rank", "WORLD_SIZE": "world_size"}
#: Slurm's variables (its tasks' place in the step) and what each stands for.
SLURM_VARIABLES: dict[str, str] = {"SLURM_PROCID": "rank", "SLURM_LOCALID": "local_rank", "SLURM_NTASKS": "world_size"}


def disagreeing_variables(environ: Mapping[str, str], source: str, own: Mapping[str, tuple[str, int]],
                          others: Mapping[str, str]) -> list[str]:
    """The variables of ``others`` set in ``environ`` whose value differs from ``source``'s, each with both values.

    Args:
        environ: the process's environment.
        source: the launcher whose variables win, for the message.
        own: what that launcher says, by quantity (``"rank"``): its variable and its value.
        others: the variables of other launchers, each with the quantity it stands for.
    """
    found = []
    for var, what in others.items():
        value = environ.get(var)
        if value is not None and what in own and value.strip() != str(own[what][1]):
            name, truth = own[what]
            found.append(f"{var}={value} (ignored; {source} gives {name}={truth})")
    return found


def ignored_variables(environ: Mapping[str, str], layout: ProcessLayout) -> list[str]:
    """The variables of other launchers that disagree with ``layout`` (the MPI launcher's own), each with both values.

    A ``RANK=0`` inherited from an outer ``torchrun`` or a shell, or Slurm's ``SLURM_PROCID`` of the
    batch step that ran ``mpiexec``: set in every rank alike, they would make every rank rank 0.

    >>> ignored_variables({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
    ...                    "RANK": "0"}, read_layout({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
    ...                                              "MPI_LOCALNRANKS": "2"}))
    ['RANK=0 (ignored; MPICH / Hydra (also Intel MPI) gives PMI_RANK=3)']
    """
    launcher = detect_launcher(environ)
    assert launcher is not None, "a layout is read from a launcher's variables"
    size_var = next((var for var in launcher.size if var in environ), "a world size")
    own = {"rank": (launcher.rank, layout.rank), "local_rank": (launcher.local_rank, layout.local_rank),
           "world_size": (size_var, layout.world_size)}
    return disagreeing_variables(environ, layout.launcher, own, {**GENERIC_VARIABLES, **SLURM_VARIABLES})


__all__ = [
    "GENERIC_VARIABLES",
    "LAUNCHERS",
    "LOCAL_SIZE_ENV",
    "SLURM_VARIABLES",
    "WORLD_SIZE_ENV",
    "LaunchLayoutError",
    "LauncherVariables",
    "ProcessLayout",
    "SizeSource",
    "detect_launcher",
    "disagreeing_variables",
    "ignored_variables",
    "mpi4py_sizes",
    "read_layout",
]
