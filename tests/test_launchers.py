"""Unit tests (no processes): launcher variables, AnyMPIEnvironment, layout checks, interface choice."""

from __future__ import annotations

from datetime import timedelta

import pytest

from lightning_anyaccel.cluster import gloo_interface, rendezvous
from lightning_anyaccel.cluster.environments import AnyMPIEnvironment
from lightning_anyaccel.cluster.launch_layout import LAUNCHERS, LaunchLayoutError, detect_launcher, read_layout

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


def test_pals_without_a_world_size_takes_it_from_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {k: v for k, v in SAMPLES["Cray PALS (Aurora, Polaris)"].items() if not k.startswith("PMI")}
    _set_env(monkeypatch, sample)
    env = AnyMPIEnvironment()
    with pytest.raises(LaunchLayoutError, match="does not say how many"):
        env.world_size()
    env.set_world_size(4)
    assert env.world_size() == 4 and env.node_rank() == 1


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
        ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, "not MPI_LOCALNRANKS"),
    ],
)
def test_inconsistent_variables_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(LaunchLayoutError, match=message):
        read_layout(env)


def _set_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for launcher in LAUNCHERS:
        for var in launcher.variables:
            monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
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
