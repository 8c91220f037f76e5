"""The fault matrix's hangs outside collectives, and launchers that die: bounded, stacks printed, nothing left.

Same script and machinery as ``tests/test_faults.py`` (``tests/scripts/fault_train.py``, 2 ranks on
CPU, a marker variable to find every process of the job, records for ``docs/fault_table.py``):

- a rank that sleeps in ``training_step``, and a rank whose DataLoader worker never finishes its
  start: the stall watchdog (``stall_timeout`` of :data:`STALL_S` seconds here) prints every rank's
  stack, names the stalled rank and where it is, and ends the job;
- the launcher ``SIGKILL``\\ ed while the ranks train with a DataLoader worker each (the package's
  own, ``torchrun``, Open MPI's ``mpirun``, MPICH's ``mpiexec``, ``srun``): every rank and every
  worker is gone within :data:`LAUNCHER_BOUND_S` (CI runs the package's own and ``mpirun``;
  ``ANYACCEL_FAULT_MATRIX_FULL=1`` every launcher);
- a healthy launcher that starts its ranks from a helper thread which then exits: the ranks
  train to the end (the kernel's parent-death signal follows the *thread* that forked; the
  package's launcher watch follows the process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from _cluster import PYTHON, ROOT, Job, full, missing, not_root, slurm_cluster
from lightning_anyaccel.kit.tools.local_runs import free_port
from test_faults import (
    MARKER,
    SCRIPT,
    STARTUP_S,
    TIMEOUT_S,
    Outcome,
    assert_failed_cleanly,
    job_processes,
    kill_all,
    processes_left,
    run_fault,
    write_record,
)

pytestmark = pytest.mark.slow

#: The stall bound of these jobs (seconds): short, the collective timeout (:data:`TIMEOUT_S`) is longer.
STALL_S = 3
#: The stalled job is gone within this many seconds of the fault: the bound, the watchdog's period,
#: the other ranks' stack dumps (2 s) and the stack printing.
STALL_BOUND_S = STALL_S + 20
#: Every rank and DataLoader worker is gone within this many seconds of the launcher's SIGKILL
#: (the ranks poll their parent every 0.25 s; a rank 0 killed as the package's launcher leaves its
#: workers to torch's own parent check, every 5 s).
LAUNCHER_BOUND_S = 10
VENV_BIN = Path(sys.executable).parent
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}


def torchrun() -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), str(SCRIPT)]


HANGS = [
    # (cell, fault, frontend, launcher, where the report must say the rank was)
    pytest.param("sleep-trainer-ddp-popen", "sleep", "trainer", "popen", "in sleep_forever", id="sleep-trainer"),
    pytest.param("loader-trainer-ddp-torchrun", "loader", "trainer", "torchrun", "in a DataLoader worker's start",
                 id="loader-trainer-torchrun"),
    pytest.param("sleep-fabric-ddp-popen", "sleep", "fabric", "popen", "in sleep_forever", id="sleep-fabric",
                 marks=full),
    pytest.param("loader-trainer-ddp-popen", "loader", "trainer", "popen", "in a DataLoader worker's start",
                 id="loader-trainer-popen", marks=full),
]


@pytest.mark.parametrize(("cell", "fault", "frontend", "launcher", "where"), HANGS)
def test_a_hang_outside_collectives_prints_every_stack_and_ends_the_job(
        tmp_path: Path, cell: str, fault: str, frontend: str, launcher: str, where: str) -> None:
    """Rank 1 hangs outside any collective: the watchdog names it and where, prints the stacks, ends the job."""
    command = torchrun() if launcher == "torchrun" else None
    outcome = run_fault(tmp_path, cell, "--frontend", frontend, "--fault", fault, "--stall-timeout", str(STALL_S),
                        "--num-workers", "1" if fault == "loader" else "0", command=command,
                        env={"LIGHTNING_ANYACCEL_STALL_DIR": str(tmp_path / "stacks")},
                        wait_s=STARTUP_S + TIMEOUT_S + 60)
    write_record(f"hang-{cell}", f"rank 1 hangs ({fault})", "ddp", frontend, launcher, 1, outcome,
                 "the watchdog prints every rank's stack, names rank 1 and where; the job ends",
                 bound_s=STALL_BOUND_S)
    # rank 1 stalls, and so does rank 0 waiting for it: the first to see its bound pass reports for both
    assert_failed_cleanly(outcome, "made no progress (no training step, no collective)", "rank 1 Python stacks",
                          bound_s=STALL_BOUND_S)
    line = next(text for text in outcome.output.splitlines() if "[lightning_anyaccel]   rank 1 (pid" in text)
    assert where in line, line
    rank0 = next(text for text in outcome.output.splitlines() if "[lightning_anyaccel]   rank 0 (pid" in text)
    assert "waiting for rank 1" in rank0, rank0
    assert (tmp_path / "stacks" / "rank1.stack").read_text().strip(), "no stack file for rank 1"


LAUNCHERS = {
    "popen": lambda: [PYTHON, str(SCRIPT)],
    "torchrun": torchrun,
    "mpirun": lambda: ["/usr/bin/mpirun", "--bind-to", "none", "--oversubscribe", "-n", "2", PYTHON, str(SCRIPT)],
    "mpiexec": lambda: [str(VENV_BIN / "mpiexec"), "-n", "2", "-launcher", "fork", PYTHON, str(SCRIPT)],
}


def kill_launcher_while_training(tmp_path: Path, cell: str, launcher: str, command: list[str],
                                 env: dict[str, str] | None = None, strategy: str = "ddp") -> Outcome:
    """Start the job (2 ranks, a DataLoader worker each, training until killed), SIGKILL the launcher once
    both ranks trained, and measure until no process of the job is left."""
    out = tmp_path / cell
    marker = uuid.uuid4().hex
    job_env = {MARKER: marker, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(env or {})}
    with Job(env=job_env) as job:
        proc = job.spawn([*command, "--out", str(out), "--max-steps", "0", "--num-workers", "1", "--timeout",
                          str(TIMEOUT_S), "--strategy", strategy], tmp_path / f"{cell}.log")
        end = time.monotonic() + STARTUP_S + 60
        while time.monotonic() < end and len(list(out.glob("rank*.json"))) < 2 and proc.poll() is None:
            time.sleep(0.2)
        trained = len(list(out.glob("rank*.json")))
        before = job_processes(marker)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        left = processes_left(marker, grace_s=LAUNCHER_BOUND_S + 5)
        seconds = time.time() - killed_at
    kill_all(left)
    log = (tmp_path / f"{cell}.log").read_text(errors="replace")
    assert trained == 2, f"the ranks never trained ({trained} of 2)\n{log[-4000:]}"
    expected = 4 if launcher == "popen" else 5  # the package's launcher is rank 0 itself
    assert len(before) >= expected, f"expected the launcher, 2 ranks and their workers: {before}"
    outcome = Outcome([-9], log, seconds, sorted(left.values()))
    write_record(f"launcher-killed-{cell}", f"{launcher} SIGKILLed", strategy, "trainer", launcher, 1, outcome,
                 "every rank and DataLoader worker ends", bound_s=LAUNCHER_BOUND_S)
    assert not left, f"outlived the launcher: {left}\n{log[-3000:]}"
    assert seconds <= LAUNCHER_BOUND_S, f"{seconds:.1f} s"
    return outcome


@pytest.mark.parametrize(("launcher", "strategy"), [
    # CI: the package's own launcher and one external; every launcher with ANYACCEL_FAULT_MATRIX_FULL=1
    pytest.param("popen", "ddp", id="popen"),
    pytest.param("mpirun", "ddp", id="mpirun"),
    pytest.param("torchrun", "ddp", id="torchrun", marks=full),
    pytest.param("mpiexec", "ddp", id="mpiexec", marks=full),
    # the seed users' case: DeepSpeed ZeRO-2 under Open MPI's mpirun, a DataLoader worker per rank
    pytest.param("mpirun", "deepspeed", id="mpirun-deepspeed", marks=full),
])
def test_killed_launcher_leaves_no_rank_and_no_worker(tmp_path: Path, launcher: str, strategy: str) -> None:
    """SIGKILL the launcher mid-training: every rank and every DataLoader worker is gone within the bound."""
    if launcher == "mpirun" and (reason := missing("/usr/bin/mpirun")):
        pytest.skip(reason)
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    env = {**OMPI_ENV} if launcher == "mpirun" else None
    cell = launcher if strategy == "ddp" else f"{launcher}-{strategy}"
    kill_launcher_while_training(tmp_path, cell, launcher, LAUNCHERS[launcher](), env=env, strategy=strategy)


@full
def test_killed_srun_leaves_no_rank_and_no_worker(tmp_path: Path) -> None:
    """The same under SLURM: ``srun`` (the job step's client) SIGKILLed on a private cluster."""
    if reason := not_root() or missing("slurmctld", "slurmd", "munged", "srun"):
        pytest.skip(reason)
    with slurm_cluster() as cluster:
        command = ["srun", "-N", "1", "--ntasks-per-node=2", "--export=ALL", PYTHON, str(SCRIPT)]
        kill_launcher_while_training(tmp_path, "srun", "srun", command, env=cluster.env)


HELPER_THREAD_LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, threading, time
    script, out = sys.argv[1], sys.argv[2]
    procs = []
    def start():  # the ranks are forked by this thread, which then exits
        for rank in range(2):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "NODE_RANK": "0"}
            procs.append(subprocess.Popen([sys.executable, script, "--out", out, "--max-steps", "6",
                                           "--num-workers", "1", "--timeout", "120"], env=env))
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    time.sleep(1)
    sys.exit(max(proc.wait() for proc in procs))
""")


def test_a_launcher_that_forks_from_a_helper_thread_keeps_its_ranks(tmp_path: Path) -> None:
    """The thread that started the ranks exits at once; the launcher lives: both ranks train to the end."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(HELPER_THREAD_LAUNCHER)
    out = tmp_path / "out"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([PYTHON, str(launcher), str(SCRIPT), str(out)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=STARTUP_S + 120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (out / "done").exists(), proc.stderr[-4000:]
