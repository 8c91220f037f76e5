"""Test helpers for multi-node jobs on one machine: process groups, namespaces, a SLURM cluster.

Every helper bounds its waits and cleans up in ``finally``/``__exit__``, also when a test fails.
Network addresses used: 127.0.0.1, and addresses inside the namespaces made here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lightning_anyaccel.kit.tools.local_runs import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "scale_train.py"
LAUNCH = ROOT / "scripts" / "launch"
PYTHON = sys.executable

#: Fault-matrix cells whose code path another test already covers (docs/faults.md, "full"): they run
#: with ANYACCEL_FAULT_MATRIX_FULL=1 only, so that CI stays within its time budget.
FULL_MATRIX = os.environ.get("ANYACCEL_FAULT_MATRIX_FULL") == "1"
full = pytest.mark.skipif(not FULL_MATRIX,
                          reason="repeats a covered code path; ANYACCEL_FAULT_MATRIX_FULL=1 runs it (docs/faults.md)")


def missing(*tools: str) -> str | None:
    """A skip reason naming the first tool not on PATH (``.ci/run`` installs them)."""
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} not installed (CI installs it: see .ci/run)"
    return None


def not_root() -> str | None:
    return None if os.geteuid() == 0 else "needs root (network namespaces / slurmd)"


def train_args(out: Path, *extra: str, devices: int = 2, num_nodes: int = 2) -> list[str]:
    return [str(SCRIPT), "--devices", str(devices), "--num-nodes", str(num_nodes), "--out", str(out), *extra]


@dataclass
class Result:
    """How one command of a :class:`Job` ended."""

    returncode: int | None
    output: str
    seconds: float


@dataclass
class Job:
    """Commands started together (one per "node"), each in its own process group.

    ``wait`` returns within ``timeout`` seconds; whatever is still running then is killed
    (the whole process group) and reported with ``returncode=None``.
    """

    env: dict[str, str] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)

    def spawn(self, command: list[str], log: Path, env: dict[str, str] | None = None,
              cwd: Path = ROOT) -> subprocess.Popen:
        # PYTHONFAULTHANDLER: a process that aborts (SIGABRT, SIGSEGV) prints every thread's Python stack
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **self.env, **(env or {})}
        handle = open(log, "w")
        proc = subprocess.Popen(
            command, cwd=cwd, env=full_env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        handle.close()
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def wait(self, timeout: float, kill: bool = True) -> list[Result]:
        """Each command's result; ``kill=False``: leave what the commands started for the caller to inspect."""
        deadline = self.start + timeout
        ended: dict[int, float] = {}
        while time.monotonic() < deadline and len(ended) < len(self.procs):
            for i, proc in enumerate(self.procs):
                if i not in ended and proc.poll() is not None:
                    ended[i] = time.monotonic() - self.start
            time.sleep(0.2)
        if kill or len(ended) < len(self.procs):
            self.kill()
        return [
            Result(proc.returncode if i in ended else None, log.read_text(errors="replace"), ended.get(i, timeout))
            for i, (proc, log) in enumerate(zip(self.procs, self.logs))
        ]

    def kill(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.wait(timeout=10)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def alive_pids(out: Path, grace_s: float = 5.0) -> list[int]:
    """Training processes (from ``<out>/pid.*``) still alive after up to ``grace_s`` seconds."""
    pids = [int(p.name.split(".", 1)[1]) for p in out.glob("pid.*")]
    end = time.monotonic() + grace_s
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def reports(out: Path) -> dict[int, dict]:
    """``rank -> report`` for every ``rank<N>.json`` the training script wrote."""
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def sh(*args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=check)


@dataclass(frozen=True)
class Namespace:
    name: str
    interface: str
    address: str


@contextmanager
def veth_hosts(tag: str) -> Iterator[tuple[Namespace, Namespace]]:
    """Two network namespaces ("hosts") joined by a veth pair, 10.213.<x>.1 and .2/24.

    Names carry ``tag`` (unique per test run) so parallel runs do not collide; both
    namespaces (and with them the veth pair) are deleted on exit.
    """
    subnet = 1 + os.getpid() % 250
    hosts = tuple(
        Namespace(f"anyaccel-{tag}-{i}", f"av{tag}{i}"[:15], f"10.213.{subnet}.{i + 1}") for i in range(2)
    )
    try:
        for host in hosts:
            sh("ip", "netns", "add", host.name)
            sh("ip", "-n", host.name, "link", "set", "lo", "up")
        sh("ip", "link", "add", hosts[0].interface, "type", "veth", "peer", "name", hosts[1].interface)
        for host in hosts:
            sh("ip", "link", "set", host.interface, "netns", host.name)
            sh("ip", "-n", host.name, "addr", "add", f"{host.address}/24", "dev", host.interface)
            sh("ip", "-n", host.name, "link", "set", host.interface, "up")
        yield hosts  # type: ignore[misc]
    finally:
        for host in hosts:
            sh("ip", "netns", "del", host.name, check=False)


SLURM_CONF = """\
ClusterName=anyaccel
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.sock
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=anyaccel-n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={port1} CPUs=2 State=UNKNOWN
NodeName=anyaccel-n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@dataclass
class SlurmCluster:
    """slurmctld + two slurmd (nodes ``anyaccel-n1``/``-n2`` on 127.0.0.1) and a private munged."""

    dir: Path
    env: dict[str, str]
    procs: list[subprocess.Popen]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)

    def wait_for_job(self, job_id: str, timeout: float) -> str:
        """Poll until the job leaves the queue (``sbatch --wait`` polls every few seconds); its final state.

        Without accounting, the state comes from ``scontrol show job`` (kept for MinJobAge, 300 s).
        A job still running at ``timeout`` is cancelled and reported as ``TIMEOUT(test)``.
        """
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = self.run("scontrol", "-o", "show", "job", job_id, timeout=10).stdout
            state = next((f.split("=", 1)[1] for f in info.split() if f.startswith("JobState=")), "UNKNOWN")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return state
            time.sleep(0.5)
        self.run("scancel", job_id, timeout=10)
        return "TIMEOUT(test)"


@contextmanager
def slurm_cluster(start_timeout: float = 60) -> Iterator[SlurmCluster]:
    """A private SLURM cluster for the block; its directory is removed afterwards.

    The directory is a short one directly in /tmp: slurmd's socket paths (its spool directory plus
    job and step ids) must fit in 108 bytes, which pytest's temporary paths (longer still under
    pytest-xdist: ``.../popen-gw0/<test name>0/``) do not; a step then never starts.
    """
    workdir = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    try:
        with _slurm_daemons(workdir, start_timeout) as cluster:
            yield cluster
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _slurm_daemons(workdir: Path, start_timeout: float) -> Iterator[SlurmCluster]:
    (workdir / "state").mkdir(exist_ok=True)
    host = socket.gethostname()
    conf = workdir / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, dir=workdir, ctld_port=free_port(), port1=free_port(),
                                      port2=free_port()))
    env = {"SLURM_CONF": str(conf)}
    procs: list[subprocess.Popen] = []

    def start(*command: str) -> None:
        log = open(workdir / f"{Path(command[0]).name}-{len(procs)}.out", "w")
        procs.append(subprocess.Popen(list(command), env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        log.close()

    try:
        key = workdir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        start("munged", "--foreground", "--force", f"--socket={workdir}/munge.sock", f"--key-file={key}",
              f"--pid-file={workdir}/munged.pid", f"--log-file={workdir}/munged.log",
              f"--seed-file={workdir}/munged.seed")
        _wait_for(lambda: (workdir / "munge.sock").exists(), 20, "munged socket", workdir)
        start("slurmctld", "-D", "-i", "-f", str(conf))
        for node in ("anyaccel-n1", "anyaccel-n2"):
            start("slurmd", "-D", "-N", node, "-f", str(conf))
        cluster = SlurmCluster(workdir, env, procs)

        def nodes_idle() -> bool:
            out = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", timeout=10).stdout.split()
            return out.count("idle") == 2

        _wait_for(nodes_idle, start_timeout, "two idle slurm nodes", workdir)
        yield cluster
    finally:
        if len(procs) == 4:  # cancel what is left, so slurmd's step daemons end before slurmd does
            subprocess.run(["scancel", "--full", "--user=root"], env={**os.environ, **env}, capture_output=True,
                           timeout=30, check=False)
            _poll(lambda: not subprocess.run(["squeue", "-h"], env={**os.environ, **env},
                                                     capture_output=True, text=True, timeout=10).stdout.strip(), 20)
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _poll(predicate, timeout: float) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds (asked every 0.5 s; errors count as not yet)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if predicate():
                return True
        except (OSError, subprocess.SubprocessError):
            pass
        time.sleep(0.5)
    return False


def _wait_for(predicate, timeout: float, what: str, workdir: Path) -> None:
    if _poll(predicate, timeout):
        return
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(workdir.glob("*.log")))
    logs += "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(workdir.glob("*.out")))
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")
