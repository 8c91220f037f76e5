"""Every launch path, end to end on CPU: 2 "nodes" x 2 processes through the files in scripts/launch/.

Addresses: 127.0.0.1, or the test's own network namespaces. Tests needing root or a tool
that is missing here skip with the reason; ``.ci/run`` installs the tools so CI runs them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _cluster import (
    LAUNCH,
    PYTHON,
    Job,
    alive_pids,
    kill_pids,
    missing,
    not_root,
    reports,
    slurm_cluster,
    train_args,
    veth_hosts,
)
from device_passes import skip_repeat
from lightning_anyaccel.kit.tools.local_runs import free_port

pytestmark = pytest.mark.slow
VENV_BIN = Path(sys.executable).parent
MPICH = VENV_BIN / "mpiexec"
#: Debian's Open MPI launcher, by absolute path: with the venv activated, `mpirun` on PATH is MPICH's.


def assert_trained(out: Path, environment: str, world_size: int = 4, per_node: int = 2) -> dict[int, dict]:
    """Every rank finished, with the right place in the job and the same weights."""
    found = reports(out)
    assert sorted(found) == list(range(world_size)), f"ranks that finished: {sorted(found)}"
    for rank, report in found.items():
        assert report["world_size"] == world_size
        assert report["environment"] == environment
        assert (report["node_rank"], report["local_rank"]) == divmod(rank, per_node), report
        assert report["global_step"] > 0
    assert len({tuple(r["weights"]) for r in found.values()}) == 1, "ranks ended with different weights"
    leftovers = alive_pids(out)
    kill_pids(leftovers)
    assert not leftovers, f"processes outlived the job: {leftovers}"
    return found


def test_env_vars_on_localhost(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with Job(env=env) as job:
        for node in (0, 1):
            job.spawn(["bash", str(LAUNCH / "env_vars.sh"), PYTHON, *train_args(out)], tmp_path / f"node{node}.log",
                      env={"NODE_RANK": str(node)})
        results = job.wait(timeout=150)
    assert [r.returncode for r in results] == [0, 0], results[-1].output[-3000:]
    assert_trained(out, "LightningEnvironment")


@pytest.mark.skipif(bool(not_root() or missing("ip")), reason=str(not_root() or missing("ip")))
def test_two_hosts_in_network_namespaces(tmp_path: Path) -> None:
    """Each node in its own namespace; gloo must use the veth, not the loopback the host name resolves to.

    After training, rank 3 hangs while the others wait for it: the stall watchdog of the rank that
    reports prints the stacks of all 4 ranks, those of the other node posted through the job's store
    (each node has a stack directory of its own, as separate hosts have), and every process ends.
    """
    tag = f"{os.getpid() % 10000}"
    with veth_hosts(tag) as hosts:
        main = hosts[0].address
        out = tmp_path / "out"
        with Job(env={"MASTER_ADDR": main, "MASTER_PORT": str(free_port())}) as job:
            for node, host in enumerate(hosts):
                job.spawn(["ip", "netns", "exec", host.name, "bash", str(LAUNCH / "env_vars.sh"), PYTHON,
                           *train_args(out, "--timeout", "30", "--stall-rank", "3", "--stall-timeout", "3")],
                          tmp_path / f"node{node}.log",
                          env={"NODE_RANK": str(node), "LIGHTNING_ANYACCEL_STALL_DIR": str(tmp_path / f"stall{node}")})
            results = job.wait(timeout=150)
        output = "\n".join(r.output for r in results)
        assert all(r.returncode not in (0, None) for r in results), output[-3000:]
        found = assert_trained(out, "LightningEnvironment")
        # the package derived the interface from MASTER_ADDR on every rank
        assert {found[r]["gloo_ifname"] for r in (0, 1)} == {hosts[0].interface}
        assert {found[r]["gloo_ifname"] for r in (2, 3)} == {hosts[1].interface}
        # one rank of the job reports; it names every rank of both nodes and where it was (rank 3 in the
        # callback that hangs), prints their stacks, and the other node's ranks end when told
        reporting = [node for node, r in enumerate(results) if "made no progress" in r.output]
        assert len(reporting) == 1 and output.count("made no progress") == 1, output[-4000:]
        report, other = results[reporting[0]].output, results[1 - reporting[0]].output
        places = {r: line for r in range(4) for line in report.splitlines()
                  if line.startswith(f"[lightning_anyaccel]   rank {r} (pid")}
        assert sorted(places) == [0, 1, 2, 3], report[-4000:]
        assert "in on_train_end" in places[3], places[3]
        assert all("waiting for rank 3" in places[r] for r in (0, 1, 2)), places
        assert all(f"--- rank {r} Python stacks" in report for r in range(4)), report[-4000:]
        assert "reported a stall of the job" in other, other[-3000:]

        # Control: force gloo onto loopback (what happens without the derivation). The job
        # must not train, and every process must end within the timeout (15 s) plus margin.
        # One process per node: the connection that fails is the one between the nodes.
        out = tmp_path / "control"
        with Job(env={"MASTER_ADDR": main, "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo"}) as job:
            for node, host in enumerate(hosts):
                job.spawn(["ip", "netns", "exec", host.name, "bash", str(LAUNCH / "env_vars.sh"), PYTHON,
                           *train_args(out, "--timeout", "15", devices=1)], tmp_path / f"control{node}.log",
                          env={"NODE_RANK": str(node)})
            results = job.wait(timeout=90)
        assert all(r.returncode not in (0, None) for r in results), [(r.returncode, r.seconds) for r in results]
        assert not reports(out)
        assert any("Gloo connectFullMesh failed" in r.output or "lightning_anyaccel" in r.output for r in results)
        leftovers = alive_pids(out)
        kill_pids(leftovers)
        assert not leftovers


@pytest.mark.skipif(not (VENV_BIN / "torchrun").exists(), reason="torchrun not next to this python")
def test_torchrun_c10d(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {"RDZV_HOST": "127.0.0.1", "RDZV_PORT": str(free_port()), "TORCHRUN": str(VENV_BIN / "torchrun"),
           "RDZV_TIMEOUT": "60"}
    with Job(env=env) as job:
        for node in (0, 1):
            job.spawn(["bash", str(LAUNCH / "torchrun.sh"), *train_args(out)], tmp_path / f"node{node}.log")
        results = job.wait(timeout=150)
    assert [r.returncode for r in results] == [0, 0], results[-1].output[-3000:]
    assert_trained(out, "TorchElasticEnvironment")


@pytest.mark.skipif(not (VENV_BIN / "torchrun").exists(), reason="torchrun not next to this python")
def test_torchrun_with_another_process_count_fails_fast_on_every_rank(tmp_path: Path) -> None:
    """torchrun starts 2 processes, the script asks for devices=3: every rank refuses before training, none stays.

    A repeat (docs/contributing.md, "Repeats"): the refusal (``check_process_count``, in every rank before any
    process group) runs with torchrun's variables for every strategy and both front ends in
    tests/test_launchers.py, in real ranks that then end in the MPICH test below, and torchrun's variables reach
    real ranks in test_torchrun_c10d."""
    skip_repeat("tests/test_launchers.py::test_every_strategy_refuses_a_launch_of_another_process_count,"
                " test_mpiexec_with_a_mismatched_trainer_fails_fast_on_every_rank and test_torchrun_c10d")
    out = tmp_path / "out"
    with Job(env={}) as job:
        job.spawn([str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "--max-restarts=0",
                   *train_args(out, devices=3, num_nodes=1)], tmp_path / "torchrun.log")
        results = job.wait(timeout=90)
    assert results[0].returncode not in (0, None)
    assert results[0].seconds < 60
    message = "torchrun launched 2 processes but Trainer(devices=3, num_nodes=1) expects 3: pass devices=2"
    assert results[0].output.count(message) >= 2, results[0].output[-3000:]  # both ranks, not one crash
    assert not reports(out)
    leftovers = alive_pids(out)
    kill_pids(leftovers)
    assert len(list(out.glob("pid.*"))) == 2 and not leftovers, f"processes outlived the job: {leftovers}"


@pytest.mark.skipif(not MPICH.exists(), reason="MPICH's mpiexec not installed (pip install mpich; CI does)")
def test_mpich_through_the_pbs_script(tmp_path: Path) -> None:
    """The Aurora PBS script with MPICH's Hydra: two simulated nodes from a PBS node file."""
    out = tmp_path / "out"
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\n127.0.0.1\n")
    env = {
        "PBS_NODEFILE": str(nodefile), "PPN": "2", "MASTER_PORT": str(free_port()), "MPIEXEC": str(MPICH),
        "MPIEXEC_EXTRA_ARGS": "-launcher fork -hosts localhost:2,127.0.0.1:2",
    }
    with Job(env=env) as job:
        job.spawn(["bash", str(LAUNCH / "aurora.pbs"), PYTHON, *train_args(out)], tmp_path / "mpiexec.log")
        results = job.wait(timeout=150)
    assert results[0].returncode == 0, results[0].output[-3000:]
    assert_trained(out, "AnyMPIEnvironment")


#: PBS's qsub on this machine: runs the job script at once on a one-node job (tests/pbs/qsub)
QSUB_DIR = Path(__file__).parent / "pbs"
#: the Aurora job script's documented submission (docs/devices/xpu.md, its own header), PPN=2 on CPU
DOCUMENTED_QSUB = ["qsub", "-v", "PPN=2,TRAIN_SCRIPT=train.py", "scripts/launch/aurora.pbs"]


def _aurora_project(tmp_path: Path) -> Path:
    """A user's project directory as the xpu page has it: the job script and the repository's example."""
    project = tmp_path / "project"
    (project / "scripts" / "launch").mkdir(parents=True)
    (project / "scripts" / "launch" / "aurora.pbs").write_text((LAUNCH / "aurora.pbs").read_text())
    (project / "train.py").write_text((Path(__file__).parents[1] / "examples" / "train.py").read_text())
    return project


@pytest.mark.skipif(not MPICH.exists(), reason="MPICH's mpiexec not installed (pip install mpich; CI does)")
def test_documented_aurora_job_trains_the_example(tmp_path: Path) -> None:
    """`qsub -v PPN=..,TRAIN_SCRIPT=train.py scripts/launch/aurora.pbs` as documented, with examples/train.py: one node,
    MPICH's mpiexec (first on PATH, as the venv's), no command of ours; the example's own success line."""
    project = _aurora_project(tmp_path)
    env = {"PATH": f"{QSUB_DIR}:{VENV_BIN}:{os.environ['PATH']}", "MASTER_PORT": str(free_port()),
           "MPIEXEC_EXTRA_ARGS": "-launcher fork"}
    with Job(env=env) as job:
        job.spawn(DOCUMENTED_QSUB, tmp_path / "job.log", cwd=project)
        results = job.wait(timeout=200)
    assert results[0].returncode == 0, results[0].output[-3000:]
    assert "trained on cpu x 2 for 3 epochs" in results[0].output, results[0].output[-3000:]


def test_aurora_job_sets_up_the_cluster_environment(tmp_path: Path) -> None:
    """Where `module` knows `frameworks`: the job script loads it, activates $VENV and binds 12 ranks to ALCF's
    cores; a VENV that is not one stops the job with the command that makes it. The cluster's `module` and
    `mpiexec` are stand-ins here that record what they were asked (no training: 12 ranks)."""
    project = _aurora_project(tmp_path)
    fakes, log = tmp_path / "bin", tmp_path / "calls.log"
    fakes.mkdir()
    (fakes / "module").write_text('#!/usr/bin/env bash\necho "module $*" >> "$CALLS"\n'
                                  '[ "$1 $2" = "is-avail frameworks" ] || [ "$1 $2" = "load frameworks" ]\n')
    (fakes / "mpiexec").write_text('#!/usr/bin/env bash\necho "python=$(command -v python)" >> "$CALLS"\n'
                                   'echo "mpiexec $*" >> "$CALLS"\n')
    for tool in fakes.iterdir():
        tool.chmod(0o755)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=120)
    env = {**os.environ, "PATH": f"{QSUB_DIR}:{fakes}:{os.environ['PATH']}", "CALLS": str(log)}
    command = ["qsub", "-v", f"PPN=12,TRAIN_SCRIPT=train.py,VENV={venv}", "scripts/launch/aurora.pbs"]
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert "module load frameworks" in calls, calls
    assert f"python={venv}/bin/python" in calls, calls
    bind = "list:4-7:8-11:12-15:16-19:20-23:24-27:56-59:60-63:64-67:68-71:72-75:76-79"
    assert f"mpiexec -n 12 -ppn 12 --cpu-bind {bind} python train.py --devices 12 --num_nodes 1" in calls, calls

    command[2] = f"PPN=12,VENV={tmp_path / 'no-venv'}"
    refused = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "python3 -m venv --system-site-packages" in refused.stderr, refused.stderr


#: each launch script's documented use (its header), run per "node" with examples/train.py: the variables the
#: header sets for every node, the command, and what differs per node
DOCUMENTED_USES = {
    "env_vars.sh": ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
                    "scripts/launch/env_vars.sh python train.py --devices 2 --num-nodes 2",
                    [{"NODE_RANK": "0"}, {"NODE_RANK": "1"}]),
    "torchrun.sh": ({"RDZV_HOST": "10.0.0.1", "RDZV_PORT": "29400", "NNODES": "2", "NPROC_PER_NODE": "2"},
                    "scripts/launch/torchrun.sh train.py --devices 2 --num-nodes 2", [{}, {}]),
    "mpiexec.sh": ({"MASTER_ADDR": "10.0.0.1", "NNODES": "2", "PPN": "2"},
                   "scripts/launch/mpiexec.sh python train.py --devices 2 --num-nodes 2", [{}]),
}


#: the scripts whose documented use runs the code path another test of this file runs (the script, the cluster
#: environment, 2 "nodes"): test_env_vars_on_localhost and test_two_hosts_in_network_namespaces run env_vars.sh,
#: test_torchrun_c10d runs torchrun.sh, each checking every rank in depth; mpiexec.sh's MPICH branch starts
#: the ranks of test_mpiexec_with_a_mismatched_trainer_fails_fast_on_every_rank, and the same MPICH launch of
#: 2 "nodes" x 2 (`-launcher fork -hosts localhost:2,127.0.0.1:2`) trains in test_mpich_through_the_pbs_script,
#: which checks every rank; their documented use trains with ANYACCEL_RUN_REPEATS=1 (docs/contributing.md, "Repeats")
REPEATED_USES = {"env_vars.sh": "test_env_vars_on_localhost", "torchrun.sh": "test_torchrun_c10d",
                 "mpiexec.sh": "test_mpich_through_the_pbs_script"}


def _header(script: str) -> str:
    return " ".join((LAUNCH / script).read_text().split("set -euo")[0].replace("#", " ").replace("\\", " ").split())


@pytest.mark.parametrize("script", sorted(DOCUMENTED_USES))
def test_launch_script_headers_show_their_documented_use(script: str) -> None:
    """Each launch script's header shows the usage line and the variables its documented use runs with."""
    shared, command, _ = DOCUMENTED_USES[script]
    header = _header(script)
    for name, value in shared.items():
        assert f"{name}={value}" in header, f"{script}: its header no longer sets {name}={value}"
    assert command in header, f"{script}: its header no longer shows {command!r}"


@pytest.mark.parametrize("script", sorted(DOCUMENTED_USES))
def test_documented_launch_trains_the_example(tmp_path: Path, script: str) -> None:
    """Each launch script's own usage line, as its header shows it, trains examples/train.py on 2 local "nodes"
    (10.0.0.1, the header's stand-in for node 0's address, becomes 127.0.0.1; its ports become free ones)."""
    if script in REPEATED_USES:
        skip_repeat(REPEATED_USES[script])
    if script == "mpiexec.sh" and not MPICH.exists():
        pytest.skip("MPICH's mpiexec not installed (pip install mpich; CI does)")
    shared, command, nodes = DOCUMENTED_USES[script]
    project = _aurora_project(tmp_path)
    (project / "scripts" / "launch" / script).write_text((LAUNCH / script).read_text())
    env = {**{k: v for k, v in shared.items()}, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    env.update({k: "127.0.0.1" for k, v in shared.items() if v == "10.0.0.1"})
    env.update({k: str(free_port()) for k in shared if k.endswith("_PORT")})
    if script == "mpiexec.sh":
        env["MPIEXEC_EXTRA_ARGS"] = "-launcher fork -hosts localhost:2,127.0.0.1:2"
    argv = ["bash", *command.split()]
    with Job(env=env) as job:
        for node, own in enumerate(nodes):
            job.spawn(argv, tmp_path / f"node{node}.log", env=own, cwd=project)
        results = job.wait(timeout=240)
    assert all(r.returncode == 0 for r in results), "\n".join(r.output[-2000:] for r in results)
    assert "trained on cpu x 4 for 3 epochs" in results[0].output, results[0].output[-3000:]


def test_mpiexec_with_a_mismatched_trainer_fails_fast_on_every_rank(tmp_path: Path) -> None:
    """MPICH through scripts/launch/mpiexec.sh starts one node of 2 processes, the Trainer is told 2 nodes x 1:
    the ranks refuse before connecting (no rank waits for a node that never comes)."""
    if not MPICH.exists():
        pytest.skip("MPICH's mpiexec not installed (pip install mpich; CI does)")
    out = tmp_path / "out"
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "MPIEXEC": str(MPICH), "NNODES": "1",
           "PPN": "2"}
    with Job(env=env) as job:
        job.spawn(["bash", str(LAUNCH / "mpiexec.sh"), PYTHON, *train_args(out, devices=1)], tmp_path / "mpiexec.log")
        results = job.wait(timeout=90)
    assert results[0].returncode not in (0, None)
    assert results[0].seconds < 60
    # the first ranks to refuse end the job (mpiexec stops the others), no rank waits
    assert "started 2 processes on this node, but the Trainer has devices=1" in results[0].output
    assert not reports(out)
    leftovers = alive_pids(out)
    kill_pids(leftovers)
    assert not leftovers


SLURM_REASON = not_root() or missing("slurmctld", "slurmd", "munged", "sbatch")


@pytest.mark.skipif(bool(SLURM_REASON), reason=str(SLURM_REASON))
def test_slurm_sbatch_and_srun(tmp_path: Path) -> None:
    """A real slurmctld with two slurmd: the sbatch script trains; `srun -n 4` alone is refused."""
    with slurm_cluster() as cluster:
        out = tmp_path / "out"
        job_env = f"--export=ALL,MASTER_ADDR=127.0.0.1,MASTER_PORT={free_port()},OMP_NUM_THREADS=1"
        submitted = cluster.run("sbatch", "--parsable", f"--output={tmp_path}/job.out", job_env,
                                str(LAUNCH / "slurm.sbatch"), PYTHON, *train_args(out))
        assert submitted.returncode == 0, submitted.stderr
        state = cluster.wait_for_job(submitted.stdout.strip().split(";")[0], timeout=150)
        log = (tmp_path / "job.out").read_text(errors="replace") if (tmp_path / "job.out").exists() else ""
        assert state == "COMPLETED", f"{state}\n{log[-3000:]}"
        assert_trained(out, "SLURMEnvironment")

        refused = cluster.run("srun", "-n", "2", "--kill-on-bad-exit=1", job_env, PYTHON,
                              *train_args(tmp_path / "refused"), timeout=120)
        assert refused.returncode != 0
        assert "--ntasks-per-node" in refused.stdout + refused.stderr
