"""Unit tests (no processes): launcher variables, AnyMPIEnvironment, layout checks, interface choice,
the launch guards (process count, disagreeing rank variables, PALS without sizes)."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from front_ends import EVERY_FRONT_END, FrontEndCase
from lightning_anyaccel.cluster import environments, gloo_interface, launch_layout, rendezvous
from lightning_anyaccel.cluster.environments import AnyMPIEnvironment
from lightning_anyaccel.cluster.launch_layout import LAUNCHERS, LaunchLayoutError, detect_launcher, read_layout
from lightning_anyaccel.strategies.errors import ShardingNotSupportedError
from lightning_anyaccel.strategies.families import FAMILIES

# What each launcher sets for rank 3 of 4, two per node (rank 3 = node 1, local rank 1).
SAMPLES = {
    "Open MPI": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1"},
    "Cray PALS (Aurora, Polaris)": {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "2",
                                    "PMI_RANK": "3", "PMI_SIZE": "4"},
    "MVAPICH": {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
    "MPICH / Hydra (also Intel MPI)": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                                       "MPI_LOCALNRANKS": "2"},
    "PMI (Cray PMI, Slurm PMI2)": {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"},
}


def test_every_launcher_has_a_sample() -> None:
    assert sorted(SAMPLES) == sorted(launcher.name for launcher in LAUNCHERS)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_layout_from_each_launcher(name: str) -> None:
    layout = read_layout(SAMPLES[name])
    assert (layout.launcher, layout.rank, layout.local_rank, layout.local_size, layout.node_rank) == (name, 3, 1, 2, 1)
    assert layout.world_size == 4


#: Cray PALS as it may start rank 3 of 4 (two per node): its ranks, no size of the job nor of the node.
PALS_WITHOUT_SIZES = {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1"}


def _no_mpi4py() -> None:
    """A size source for :func:`read_layout` as where mpi4py is not installed."""


@pytest.fixture
def stub_mpi4py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An importable ``mpi4py`` whose ``COMM_WORLD`` has 4 processes, 2 on this node (mpi4py is not a dependency)."""
    package = tmp_path / "stub" / "mpi4py"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "MPI.py").write_text(
        "COMM_TYPE_SHARED = 1\n"
        "class _Comm:\n"
        "    def __init__(self, size):\n        self.size = size\n"
        "    def Get_size(self):\n        return self.size\n"
        "    def Split_type(self, kind):\n        assert kind == COMM_TYPE_SHARED\n        return _Comm(2)\n"
        "    def Free(self):\n        pass\n"
        "COMM_WORLD = _Comm(4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    for name in ("mpi4py", "mpi4py.MPI"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("mpi4py", "mpi4py.MPI"):
        sys.modules.pop(name, None)


def test_pals_without_sizes_asks_mpi4py(stub_mpi4py: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert launch_layout.mpi4py_sizes() == (4, 2)
    _set_env(monkeypatch, {**PALS_WITHOUT_SIZES, "WORLD_SIZE": "1"})  # mpi4py comes before WORLD_SIZE
    env = AnyMPIEnvironment()
    assert (env.world_size(), env.local_rank(), env.node_rank()) == (4, 1, 1)
    env.set_world_size(8)  # the strategy's devices x num_nodes never replaces the launcher's size
    assert env.world_size() == 4


def test_pals_without_sizes_nor_mpi4py_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # `import mpi4py` raises ImportError
    assert launch_layout.mpi4py_sizes() is None
    _set_env(monkeypatch, PALS_WITHOUT_SIZES)
    with pytest.raises(LaunchLayoutError, match=r"did not say the number of processes \(PALS_SIZE or PMI_SIZE\) nor"
                       r" the processes per node \(PALS_LOCAL_SIZE\).*--env WORLD_SIZE=24 --env LOCAL_WORLD_SIZE=12"):
        AnyMPIEnvironment()
    monkeypatch.setenv("PALS_LOCAL_SIZE", "2")
    with pytest.raises(LaunchLayoutError, match=r"did not say the number of processes \(PALS_SIZE or PMI_SIZE\),"):
        AnyMPIEnvironment()
    # what the message asks for: the sizes passed to every rank
    monkeypatch.setenv("WORLD_SIZE", "4")
    env = AnyMPIEnvironment()
    assert (env.world_size(), env.node_rank()) == (4, 1)
    monkeypatch.delenv("PALS_LOCAL_SIZE")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert AnyMPIEnvironment().layout.local_size == 2


def test_no_launcher() -> None:
    assert detect_launcher({"RANK": "0"}) is None
    with pytest.raises(LaunchLayoutError, match="No MPI launcher variables"):
        read_layout({})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PMI_RANK": "5", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "not within the world"),
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "2"}, "local rank 2"),
        ({"PMI_RANK": "1", "PMI_SIZE": "5", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "cannot fill nodes"),
        ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "in blocks"),
        ({"PMI_RANK": "x", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, "not an integer"),
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, r"processes per node \(MPI_LOCALNRANKS\)"),
    ],
)
def test_inconsistent_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchLayoutError, match=message):
        read_layout(env, sizes=_no_mpi4py)


#: Variables of the other launchers (torchrun, srun, Lightning's own) a test clears before setting its own.
OTHER_LAUNCHERS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                   "NODE_RANK", "TORCHELASTIC_RUN_ID", "PALS_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                   "SLURM_NODEID", "SLURM_JOB_NAME", "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NTASKS_PER_NODE",
                   "SLURM_NNODES", "SLURM_JOB_ID")


def _set_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for launcher in LAUNCHERS:
        for var in launcher.variables:
            monkeypatch.delenv(var, raising=False)
    for var in OTHER_LAUNCHERS:
        monkeypatch.delenv(var, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_mpi_environment_without_mpi4py(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, SAMPLES["Open MPI"])
    assert AnyMPIEnvironment.detect()
    env = AnyMPIEnvironment()
    assert env.creates_processes_externally
    assert (env.global_rank(), env.world_size(), env.local_rank(), env.node_rank()) == (3, 4, 1, 1)
    env.set_global_rank(0)  # the launcher's rank stays authoritative
    assert env.global_rank() == 3
    env.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(LaunchLayoutError, match="MASTER_ADDR is not set"):
        _ = env.main_address
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert env.main_address == "127.0.0.1" and env.main_port == 29500


def test_mpi_environment_single_node_defaults_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert AnyMPIEnvironment().main_address == "127.0.0.1"


@pytest.mark.parametrize(
    ("devices", "num_nodes", "message"),
    [(4, 1, "started 2 processes on this node"), (2, 3, "Set num_nodes=2"), (2, 1, "Set num_nodes=2")],
)
def test_mpi_environment_refuses_a_mismatched_trainer(
    monkeypatch: pytest.MonkeyPatch, devices: int, num_nodes: int, message: str
) -> None:
    _set_env(monkeypatch, SAMPLES["MPICH / Hydra (also Intel MPI)"])
    with pytest.raises(LaunchLayoutError, match=message):
        AnyMPIEnvironment().validate_settings(num_devices=devices, num_nodes=num_nodes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_rank": 2}, "NODE_RANK=2 but the job has num_nodes=2"),
        ({"node_rank": -1}, "NODE_RANK=-1"),
        ({"local_rank": 2}, "LOCAL_RANK=2"),
        ({"world_size": 3}, "WORLD_SIZE=3 does not match devices x num_nodes = 2 x 2 = 4"),
        ({"global_rank": 4}, "RANK=4"),
    ],
)
def test_check_layout(kwargs: dict[str, int], message: str) -> None:
    args = {"num_nodes": 2, "num_processes": 2, "node_rank": 1, "local_rank": 0, **kwargs}
    with pytest.raises(LaunchLayoutError, match=message):
        rendezvous.check_layout(**args)


# ----- the launch guards: an external launcher's process count, its variables over inherited ones ---------

#: What each external launcher sets in rank 0 of a job of 4 processes (how the process count reaches us).
EXTERNAL = {
    "torchrun": {"TORCHELASTIC_RUN_ID": "g41", "RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0",
                 "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
    "srun": {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "train.sh", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "0", "SLURM_NODELIST": "node0", "SLURM_JOB_ID": "1234", "SLURM_NTASKS_PER_NODE": "4",
             "SLURM_NNODES": "1", "MASTER_ADDR": "127.0.0.1"},
    "Open MPI": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
    "Cray PALS (Aurora, Polaris)": {"PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0", "PALS_LOCAL_SIZE": "4",
                                    "PALS_SIZE": "4"},
    "the launcher (WORLD_SIZE)": {"LOCAL_RANK": "0", "NODE_RANK": "0", "WORLD_SIZE": "4",
                                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
}

#: Every (front end, name) the package registers for several processes (``any_single`` runs one).
MULTI_PROCESS = [(front, name) for family in FAMILIES if family.name != "single" for name in family.names
                 for front in ("Trainer", "Fabric")]


#: Strategies whose own check, after the guard, refuses these CPU-only tests (what the accepted count then meets).
NEXT_REFUSAL = {
    ("Trainer", "any_fsdp_cpu_offload"): "CPU offload is for accelerators",
    ("Fabric", "any_fsdp_cpu_offload"): "CPU offload is for accelerators",
    ("Fabric", "any_model_parallel"): "needs your parallelize_fn",
}


def _build(front: str, strategy: str, devices: int, num_nodes: int = 1) -> Any:
    """A Trainer or Fabric on the CPU: its connector configures the strategy's launcher, where the guards run."""
    if front == "Trainer":
        return L.Trainer(strategy=strategy, accelerator="cpu", devices=devices, num_nodes=num_nodes, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False)
    return L.Fabric(strategy=strategy, accelerator="cpu", devices=devices, num_nodes=num_nodes)


def _accepted(front: str, strategy: str, devices: int) -> None:
    """Build with the launched count: no guard refuses it (only the strategy's own CPU refusal, if any)."""
    refusal = NEXT_REFUSAL.get((front, strategy))
    if refusal is None:
        _build(front, strategy, devices)
        return
    with pytest.raises(ShardingNotSupportedError, match=refusal):
        _build(front, strategy, devices)


@pytest.mark.parametrize(("front", "strategy"), MULTI_PROCESS)
def test_every_strategy_refuses_a_launch_of_another_process_count(
    monkeypatch: pytest.MonkeyPatch, front: str, strategy: str
) -> None:
    """torchrun started 4 processes, the script asks for 2: refused before any training, naming both numbers."""
    if "deepspeed" in strategy:
        pytest.importorskip("deepspeed")
    _set_env(monkeypatch, EXTERNAL["torchrun"])
    with pytest.raises(LaunchLayoutError, match=rf"torchrun launched 4 processes but {front}\(devices=2, num_nodes=1\)"
                       r" expects 2: pass devices=4 or launch 2 per node"):
        _build(front, strategy, devices=2)
    _accepted(front, strategy, devices=4)


@pytest.mark.parametrize("launcher", sorted(EXTERNAL))
@pytest.mark.parametrize("front", ["Trainer", "Fabric"])
def test_every_external_launcher_is_counted(monkeypatch: pytest.MonkeyPatch, launcher: str, front: str) -> None:
    """The same guard for each way a launcher says how many processes it started (FSDP2: Lightning checks none)."""
    _set_env(monkeypatch, EXTERNAL[launcher])
    with pytest.raises(LaunchLayoutError, match=re.escape(
            f"{launcher} launched 4 processes but {front}(devices=3, num_nodes=1) expects 3: pass devices=4")):
        _build(front, "any_fsdp2", devices=3)
    _accepted(front, "any_fsdp2", devices=4)


@pytest.mark.parametrize("launcher", ["torchrun", "Open MPI", "Cray PALS (Aurora, Polaris)"])
@pytest.mark.parametrize("front", ["Trainer", "Fabric"])
def test_one_process_strategy_refuses_a_multi_process_launch(
    monkeypatch: pytest.MonkeyPatch, launcher: str, front: str
) -> None:
    """any_single in each of 4 launched processes would train 4 times alone: refused, naming a multi-process fix."""
    _set_env(monkeypatch, EXTERNAL[launcher])
    with pytest.raises(LaunchLayoutError, match=re.escape(
            f"{launcher} launched 4 processes but {front}(devices=1, num_nodes=1) expects 1: pass devices=4 with"
            " strategy='any_ddp' or launch 1 per node")):
        _build(front, "any_single", devices=1)


def test_one_process_strategy_under_a_launch_of_one_or_a_batch_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """One launched process, or a Slurm batch step run without srun (SLURM_NTASKS of the allocation): accepted."""
    _set_env(monkeypatch, {**EXTERNAL["torchrun"], "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
    _build("Trainer", "any_single", devices=1)
    _set_env(monkeypatch, {"SLURM_NTASKS": "4", "SLURM_JOB_NAME": "job.sbatch", "SLURM_NTASKS_PER_NODE": "4",
                           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "node0"})
    _build("Fabric", "any_single", devices=1)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_stale_generic_and_slurm_variables_never_make_every_rank_rank_0(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    """An MPI launcher's own variables win over an inherited RANK=0 and the batch step's SLURM_PROCID=0."""
    stale = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
             "SLURM_NTASKS": "1", "SLURM_NODEID": "0", "SLURM_JOB_NAME": "job.sbatch", "SLURM_NODELIST": "127.0.0.1"}
    _set_env(monkeypatch, {**SAMPLES[name], **stale})
    monkeypatch.setattr(environments, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=environments.__name__):
        trainer = _build("Trainer", "any_ddp", devices=2, num_nodes=2)
        _build("Fabric", "any_ddp", devices=2, num_nodes=2)  # one warning per process
    env = trainer.strategy.cluster_environment
    assert type(env).__name__ == "AnyMPIEnvironment"
    assert env.main_address == "127.0.0.1"  # MASTER_ADDR unset: the first node of the Slurm allocation
    assert (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size) == (3, 1, 1, 4)
    warnings = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(warnings) == 1, warnings
    launcher = next(launcher for launcher in LAUNCHERS if launcher.name == name)
    size_var = next(var for var in launcher.size if var in SAMPLES[name])
    for stale_var, own in (("RANK=0", f"{launcher.rank}=3"), ("SLURM_PROCID=0", f"{launcher.rank}=3"),
                           ("LOCAL_RANK=0", f"{launcher.local_rank}=1"), ("SLURM_LOCALID=0", f"{launcher.local_rank}=1"),
                           ("WORLD_SIZE=1", f"{size_var}=4"), ("SLURM_NTASKS=1", f"{size_var}=4")):
        assert f"{stale_var} (ignored; {name} gives {own})" in warnings[0]


@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_guards_on_both_lightning_packages(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, front_end: FrontEndCase
) -> None:
    """lightning and pytorch_lightning alike (the package's classes are rebuilt for the second): count, warning."""
    _set_env(monkeypatch, {**SAMPLES["Open MPI"], "RANK": "0"})
    monkeypatch.setattr(environments, "_warned", False)
    front = front_end.side.capitalize()
    with pytest.raises(LaunchLayoutError, match=re.escape(
            f"Open MPI launched 4 processes but {front}(devices=2, num_nodes=1) expects 2: pass devices=4")):
        front_end.build(strategy="any_fsdp2", accelerator="cpu", devices=2)
    with caplog.at_level(logging.WARNING, logger=environments.__name__):
        built = front_end.build(strategy="any_fsdp2", accelerator="cpu", devices=2, num_nodes=2)
    assert type(built.strategy.cluster_environment).__name__ == "AnyMPIEnvironment"
    assert built.strategy.global_rank == 3
    assert "RANK=0 (ignored; Open MPI gives OMPI_COMM_WORLD_RANK=3)" in caplog.text


def test_srun_overrules_an_inherited_rank(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """srun's SLURM_PROCID wins over an inherited RANK=0, named with both values; agreeing variables are not."""
    _set_env(monkeypatch, {**EXTERNAL["srun"], "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                           "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "RANK": "0", "WORLD_SIZE": "4"})
    monkeypatch.setattr(environments, "_warned", False)
    with caplog.at_level(logging.WARNING, logger=environments.__name__):
        trainer = L.Trainer(strategy="any_ddp", accelerator="cpu", devices=2, num_nodes=2, logger=False)
    assert type(trainer.strategy.cluster_environment).__name__ == "SLURMEnvironment"
    assert trainer.global_rank == 3
    assert [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()] == [
        "[lightning_anyaccel] rank 3: srun says where this process is; these variables of another launcher (inherited"
        " from an outer job or shell) disagree and are ignored: RANK=0 (ignored; srun gives SLURM_PROCID=3). Unset"
        " them in the job script to silence this."
    ]


def test_torchrun_keeps_its_environment_under_mpiexec(monkeypatch: pytest.MonkeyPatch) -> None:
    """mpiexec starting torchrun once per node: torchrun's ranks are the job's, the node's PMI_RANK is not."""
    _set_env(monkeypatch, {**EXTERNAL["torchrun"], "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1",
                           "LOCAL_WORLD_SIZE": "2", "PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0",
                           "MPI_LOCALNRANKS": "1"})
    trainer = _build("Trainer", "any_ddp", devices=2, num_nodes=2)
    assert type(trainer.strategy.cluster_environment).__name__ == "TorchElasticEnvironment"
    assert trainer.global_rank == 3


def test_default_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_anyaccel import AnyDDPStrategy

    monkeypatch.delenv(rendezvous.TIMEOUT_ENV, raising=False)
    assert AnyDDPStrategy().timeout == timedelta(minutes=10) == rendezvous.DEFAULT_TIMEOUT
    assert AnyDDPStrategy(timeout=timedelta(seconds=7)).timeout == timedelta(seconds=7)
    monkeypatch.setenv(rendezvous.TIMEOUT_ENV, "42")
    assert AnyDDPStrategy().timeout == timedelta(seconds=42)
    monkeypatch.setenv(rendezvous.TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match="not a number"):
        AnyDDPStrategy()


def test_strategy_writes_checkpoints_atomically_by_default() -> None:
    from lightning_anyaccel import AnyDDPStrategy
    from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO

    assert isinstance(AnyDDPStrategy().checkpoint_io, AtomicCheckpointIO)


def test_loopback_main_address_leaves_gloo_alone() -> None:
    environ: dict[str, str] = {}
    assert gloo_interface.configure_socket_interface("127.0.0.1", environ) is None
    assert environ == {}


def test_interface_is_derived_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # pretend the main address is remote; the real case runs in test_scaleout_launch (namespaces)
    monkeypatch.setattr(gloo_interface, "is_loopback", lambda address: False)
    monkeypatch.setattr(gloo_interface, "interface_towards", lambda address: "veth7")
    environ: dict[str, str] = {}
    assert gloo_interface.configure_socket_interface("127.0.0.1", environ) == "veth7"
    assert environ == {"GLOO_SOCKET_IFNAME": "veth7"}
    environ = {"GLOO_SOCKET_IFNAME": "eth7"}
    assert gloo_interface.configure_socket_interface("127.0.0.1", environ) is None
    assert environ == {"GLOO_SOCKET_IFNAME": "eth7"}


def test_interface_towards_loopback() -> None:
    assert gloo_interface.interface_towards("127.0.0.1") == "lo"
