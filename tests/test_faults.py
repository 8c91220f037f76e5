"""The fault matrix: every fault ends the whole job within its bound, and no checkpoint is lost.

Each cell is one test (parameterised by node count where the cell is run at one node and at two)
over one training script, ``tests/scripts/fault_train.py``: 2 processes per node on CPU, 1 node
(Lightning's launcher) or 2 "nodes" on 127.0.0.1 (the environment-variable launch: one command per
node with its ``NODE_RANK``). Each job carries a unique marker variable; one fault is injected,
and the test asserts:

- the job ends with a non-zero status on every node (or 0 for preemption, which is a clean stop);
- it ends within its bound after the fault (the strategy's ``timeout`` plus :data:`BOUND_S`, unless
  the cell says);
- no process carrying the marker is left (stopped ones included, found through ``/proc`` before the
  test's own clean-up kills anything);
- the log names the rank and the cause.

Every matrix cell writes a record (fault, strategy, launcher, nodes, seconds to end, processes
left) to ``build/fault_records/`` (or ``$ANYACCEL_FAULT_RECORDS``); ``docs/fault_table.py`` turns
the records of the last run into the matrix of ``docs/faults.md``, which also lists which test
covers which cell. Combinations that only repeat a covered code path run only with
``ANYACCEL_FAULT_MATRIX_FULL=1`` (the page says why CI skips them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from _cluster import FULL_MATRIX, PYTHON, ROOT, Job, Result, full
from lightning_anyaccel.kit.tools.local_runs import free_port

SCRIPT = ROOT / "tests" / "scripts" / "fault_train.py"
#: The strategy's timeout in these jobs (seconds). The ranks enter the rendezvous together
#: (``--start-together``), so a slow start on a loaded machine does not count against it, except
#: where the rendezvous itself is under test.
TIMEOUT_S = int(os.environ.get("ANYACCEL_FAULT_TIMEOUT_S", "15"))
#: What the package promises beyond the timeout: the job is gone within ``timeout + BOUND_S``
#: seconds of the fault (docs/faults.md). Measured figures are in the records.
BOUND_S = 30
#: A killed rank ends the job this fast, with no timeout involved (the cell runs with a timeout of 60 s).
KILL_BOUND_S = 15
#: The rendezvous cells of 2 nodes (a node never started, the port owned by a silent server): their
#: timeout, and their bound, counted from the start of the job (start-up included: the rendezvous
#: is under test, so the ranks do not wait for each other first).
RENDEZVOUS_TIMEOUT_S = 10
RENDEZVOUS_BOUND_S = 40 + RENDEZVOUS_TIMEOUT_S + 15
#: Python + Lightning start-up on a loaded machine, before the fault can happen.
STARTUP_S = float(os.environ.get("ANYACCEL_FAULT_STARTUP_S", "90"))
MARKER = "ANYACCEL_FAULT_JOB"
RECORDS = Path(os.environ.get("ANYACCEL_FAULT_RECORDS", ROOT / "build" / "fault_records"))

pytestmark = pytest.mark.slow


@dataclass
class Outcome:
    """How one fault job ended (``returncodes``: one per node's command)."""

    returncodes: list[int | None]
    output: str
    seconds_after_fault: float | None
    left: list[str] = field(default_factory=list)
    records: dict[int, dict] = field(default_factory=dict)

    @property
    def returncode(self) -> int | None:
        """Node 0's status."""
        return self.returncodes[0]

    def failed(self) -> bool:
        """Every node's command ended with a non-zero status."""
        return all(code not in (0, None) for code in self.returncodes)


def job_processes(marker: str) -> dict[int, str]:
    """``pid -> state + command`` of every live process whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found[int(proc.name)] = f"{state} {command}"
    return found


def processes_left(marker: str, grace_s: float = 5.0) -> dict[int, str]:
    """The job's processes still alive after up to ``grace_s`` seconds (a SIGKILL takes a moment to land)."""
    end = time.monotonic() + grace_s
    while (left := job_processes(marker)) and time.monotonic() < end:
        time.sleep(0.2)
    return left


def kill_all(pids: dict[int, str]) -> None:
    for pid in pids:  # never leave anything behind, whatever the assertions say
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_fault(tmp_path: Path, name: str, *args: str, nodes: int = 1, started: int | None = None,
              timeout_s: float = TIMEOUT_S, together: bool = True, fault_at_start: bool = False,
              env: dict[str, str] | None = None, wait_s: float | None = None,
              command: list[str] | None = None) -> Outcome:
    """Run one job of the fault script on ``nodes`` nodes (the first ``started`` of them started).

    ``together``: the ranks enter the rendezvous together (``--start-together``); ``fault_at_start``:
    the fault is the job's start (nothing is injected: a node that is never started, a port taken).
    What is left after ``wait_s`` is killed and reported.
    """
    out = tmp_path / name
    marker = uuid.uuid4().hex
    job_env = {MARKER: marker, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(env or {})}
    command = command or [PYTHON, str(SCRIPT)]
    wait_s = wait_s or STARTUP_S + timeout_s + BOUND_S
    layout = ["--num-nodes", str(nodes)] if nodes > 1 else []
    with Job(env=job_env) as job:
        started_at = time.time()
        for node in range(nodes if started is None else started):
            node_env = {"NODE_RANK": str(node)} if nodes > 1 else None
            job.spawn([*command, "--out", str(out), "--timeout", str(timeout_s), *layout,
                       *(["--start-together"] if together else []), *args],
                      tmp_path / f"{name}.node{node}.log", env=node_env)
        results = job.wait(timeout=wait_s, kill=False)
        ended = time.time()
        left = processes_left(marker)
    kill_all(left)
    fault_at = started_at if fault_at_start else None
    if fault_at is None and out.exists():
        fault_at = min((float(p.read_text()) for p in out.glob("fault.*")), default=None)
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")} if out.exists() else {}
    return Outcome([r.returncode for r in results], "\n".join(r.output for r in results),
                   None if fault_at is None else ended - fault_at, sorted(left.values()), records)


def write_record(cell: str, fault: str, strategy: str, frontend: str, launcher: str, nodes: int,
                 outcome: Outcome, expected: str, bound_s: float | None = None, clean_exit: bool = False,
                 timeout_s: float = TIMEOUT_S) -> None:
    """The record ``docs/fault_table.py`` reads; ``ok``: ended as promised (status, bound, nothing left)."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    bound_s = bound_s or timeout_s + BOUND_S
    status_ok = all(code == 0 for code in outcome.returncodes) if clean_exit else outcome.failed()
    in_time = outcome.seconds_after_fault is None or outcome.seconds_after_fault <= bound_s
    record = {
        "cell": cell, "fault": fault, "strategy": strategy, "frontend": frontend, "launcher": launcher,
        "nodes": nodes, "timeout_s": timeout_s, "bound_s": bound_s, "expected": expected,
        "ok": status_ok and in_time and not outcome.left,
        "returncode": outcome.returncode if len(outcome.returncodes) == 1 else "/".join(map(str, outcome.returncodes)),
        "seconds_after_fault": None if outcome.seconds_after_fault is None else round(outcome.seconds_after_fault, 1),
        "processes_left": len(outcome.left), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d"),
    }
    (RECORDS / f"{cell}.json").write_text(json.dumps(record, indent=1))


def assert_failed_cleanly(outcome: Outcome, *log_says: str, bound_s: float = TIMEOUT_S + BOUND_S) -> None:
    """Non-zero status on every node, within the bound after the fault, nothing left, the log names rank and cause."""
    tail = outcome.output[-4000:]
    assert outcome.failed(), f"status {outcome.returncodes}\n{tail}"
    assert not outcome.left, f"processes outlived the job: {outcome.left}\n{tail}"
    assert outcome.seconds_after_fault is not None, f"the fault was never injected\n{tail}"
    assert outcome.seconds_after_fault <= bound_s, f"{outcome.seconds_after_fault:.0f} s\n{tail}"
    for text in log_says:
        assert text in outcome.output, f"{text!r} not in the log\n{tail}"


def names_rank(output: str, rank: int) -> bool:
    """Whether the log names ``rank`` as the one that failed (Lightning's, torch's or the package's wording)."""
    return any(text in output for text in (f"[rank{rank}]", f"rank {rank}/", f"Process {rank} terminated"))


def launcher_name(launcher: str, nodes: int) -> str:
    """The cell's launcher as the records name it: Lightning's start method on one node, the environment variables on two."""
    return launcher if nodes == 1 else "env vars"


FROZEN = [
    # (cell, frontend, strategy, launcher, frozen rank, nodes), all with SIGSTOP at step 2
    pytest.param("stop-trainer-ddp-popen", "trainer", "ddp", "popen", 1, 1, id="trainer-ddp-popen"),
    pytest.param("stop-rank0-trainer-ddp-popen", "trainer", "ddp", "popen", 0, 1, id="rank0-trainer-ddp-popen",
                 marks=full),
    pytest.param("stop-trainer-ddp-spawn", "trainer", "ddp", "spawn", 1, 1, id="trainer-ddp-spawn"),
    pytest.param("stop-fabric-ddp-popen", "fabric", "ddp", "popen", 1, 1, id="fabric-ddp-popen", marks=full),
    pytest.param("stop-trainer-deepspeed-popen", "trainer", "deepspeed", "popen", 1, 1, id="trainer-deepspeed-popen"),
    pytest.param("stop-trainer-ddp-fork", "trainer", "ddp", "fork", 1, 1, id="trainer-ddp-fork", marks=full),
    pytest.param("stop-trainer-fsdp-popen", "trainer", "fsdp", "popen", 1, 1, id="trainer-fsdp-popen", marks=full),
    pytest.param("stop-trainer-fsdp2-popen", "trainer", "fsdp2", "popen", 1, 1, id="trainer-fsdp2-popen", marks=full),
    pytest.param("stop-fabric-fsdp-popen", "fabric", "fsdp", "popen", 1, 1, id="fabric-fsdp-popen", marks=full),
    pytest.param("stop-trainer-ddp-torchrun", "trainer", "ddp", "torchrun", 1, 1, id="trainer-ddp-torchrun", marks=full),
    # rank 3 is node 1's second process: node 1's launcher kills it (the supervision path of the popen cell)
    pytest.param("stop-trainer-ddp-popen-2nodes", "trainer", "ddp", "popen", 3, 2, id="trainer-ddp-2-nodes",
                 marks=full),
]
#: torchrun's agent sends SIGTERM, waits 30 s, then SIGKILLs (torch's ``PContext.close``).
TORCHRUN_EXTRA_S = 30


@pytest.mark.parametrize(("cell", "frontend", "strategy", "launcher", "rank", "nodes"), FROZEN)
def test_frozen_rank_ends_the_job_and_is_killed(tmp_path: Path, cell: str, frontend: str, strategy: str,
                                                launcher: str, rank: int, nodes: int) -> None:
    """SIGSTOP on one rank: the others time out, and the stopped rank is SIGKILLed too (nothing is left)."""
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    command, bound = None, TIMEOUT_S + BOUND_S
    if launcher == "torchrun":
        command = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                   "--master-port", str(free_port()), str(SCRIPT)]
        bound += TORCHRUN_EXTRA_S
    start_method = "popen" if launcher == "torchrun" else launcher
    outcome = run_fault(tmp_path, cell, "--frontend", frontend, "--strategy", strategy, "--start-method",
                        start_method, "--fault", "stop", "--fault-rank", str(rank), nodes=nodes, command=command,
                        wait_s=STARTUP_S + bound)
    write_record(cell, f"SIGSTOP rank {rank}", strategy, frontend, launcher_name(launcher, nodes), nodes, outcome,
                 "the others time out; the stopped rank is SIGKILLed", bound_s=bound)
    assert_failed_cleanly(outcome, f"rank {rank}: injecting stop", "Timed out", bound_s=bound)
    survivors = [other for other in range(2 * nodes) if other != rank]
    assert any(names_rank(outcome.output, other) for other in survivors), "the log does not say which rank timed out"
    if launcher in ("spawn", "fork") or rank == 0:  # the package's own kill, not only the kernel's
        assert "[lightning_anyaccel] killed process" in outcome.output


@pytest.mark.parametrize(("nodes", "rank"), [pytest.param(1, 1, id="1-node", marks=full),
                                             pytest.param(2, 3, id="2-nodes")])
def test_killed_rank_ends_the_job(tmp_path: Path, nodes: int, rank: int) -> None:
    """SIGKILL one rank: every other rank fails in its next collective, saying which rank it is and why.

    The timeout is 60 s, so it is the closed connection that ends the job, not the timeout.
    """
    cell = "kill-trainer-ddp-popen" if nodes == 1 else "kill-trainer-ddp-popen-2nodes"
    outcome = run_fault(tmp_path, cell, "--fault", "kill", "--fault-rank", str(rank), nodes=nodes, timeout_s=60)
    write_record(cell, f"SIGKILL rank {rank}", "ddp", "trainer", launcher_name("popen", nodes), nodes, outcome,
                 "the others fail at once (connection closed)", bound_s=KILL_BOUND_S, timeout_s=60)
    assert_failed_cleanly(outcome, f"rank {rank}: injecting kill", bound_s=KILL_BOUND_S)
    logs = outcome.output
    # Lightning's process observer, or gloo's wording for the dead peer's socket (closed or reset: a race)
    assert any(text in logs for text in ("Child process with PID", "Connection closed by peer", "Connection reset by peer"))
    # every survivor says which rank it is and why it stops; on one node, Lightning's process observer may end
    # rank 0 before its collective fails ("Child process with PID ...")
    if nodes > 1 or "Child process with PID" not in logs:
        for other in range(2 * nodes):
            if other != rank:
                assert f"[lightning_anyaccel] rank {other}/{2 * nodes}: a collective failed" in logs
    assert not any(record.get("finished") for record in outcome.records.values()), "a rank finished training"


@full
def test_raise_in_training_step_ends_the_job(tmp_path: Path) -> None:
    outcome = run_fault(tmp_path, "raise-fabric-ddp-spawn", "--frontend", "fabric", "--start-method", "spawn",
                        "--fault", "raise")
    write_record("raise-fabric-ddp-spawn", "raise in training_step (rank 1)", "ddp", "fabric", "spawn", 1,
                 outcome, "the error is raised in the launching process; the others are ended")
    assert_failed_cleanly(outcome, "injected fault: training_step raised on rank 1")


@pytest.mark.parametrize("nodes", [pytest.param(1, id="rank-stopped-1-node", marks=full),
                                   pytest.param(2, id="node-not-started-2-nodes")])
def test_rank_that_never_arrives(tmp_path: Path, nodes: int) -> None:
    """1 node: rank 1 stops itself before the rendezvous (and must be SIGKILLed with its launcher).
    2 nodes: node 1 is never started; the bound counts from the start of the job."""
    if nodes == 1:
        outcome = run_fault(tmp_path, "absent-trainer-fsdp-popen", "--strategy", "fsdp", "--fault", "absent",
                            together=False)
        write_record("absent-trainer-fsdp-popen", "rank 1 never arrives", "fsdp", "trainer", "popen", 1, outcome,
                     "the rendezvous times out; the stopped rank is SIGKILLed")
        assert_failed_cleanly(outcome, "rank 1: stopping before the rendezvous", "1/2 clients joined")
        return
    outcome = run_fault(tmp_path, "absent-node-trainer-ddp-popen-2nodes", nodes=2, started=1, together=False,
                        fault_at_start=True, timeout_s=RENDEZVOUS_TIMEOUT_S, wait_s=120)
    write_record("absent-node-trainer-ddp-popen-2nodes", "node 1 never started", "ddp", "trainer", "env vars", 2,
                 outcome, "the rendezvous times out", bound_s=RENDEZVOUS_BOUND_S, timeout_s=RENDEZVOUS_TIMEOUT_S)
    assert_failed_cleanly(outcome, bound_s=RENDEZVOUS_BOUND_S)
    logs = outcome.output
    assert "clients joined" in logs or "the rendezvous at 127.0.0.1" in logs or "Timed out" in logs


@contextmanager
def silent_server(port: int) -> Iterator[None]:
    """Owns 127.0.0.1:``port``, accepts every connection and never sends a byte."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()


def test_main_port_owned_by_a_silent_server_fails_every_rank(tmp_path: Path) -> None:
    """2 nodes; the bound counts from the start of the job."""
    port = free_port()
    with silent_server(port):
        outcome = run_fault(tmp_path, "port-trainer-ddp-popen-2nodes", nodes=2, together=False, fault_at_start=True,
                            timeout_s=RENDEZVOUS_TIMEOUT_S, env={"MASTER_PORT": str(port)}, wait_s=120)
    write_record("port-trainer-ddp-popen-2nodes", "main port owned by a silent server", "ddp", "trainer", "env vars",
                 2, outcome, "rank 0 fails at once; the others end at the rendezvous deadline",
                 bound_s=RENDEZVOUS_BOUND_S, timeout_s=RENDEZVOUS_TIMEOUT_S)
    assert_failed_cleanly(outcome, "the rendezvous at 127.0.0.1", bound_s=RENDEZVOUS_BOUND_S)
    assert "address already in use" in outcome.output.lower() or "EADDRINUSE" in outcome.output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NODE_RANK": "2"}, "NODE_RANK=2 but the job has num_nodes=2"),
        ({"NODE_RANK": "0", "WORLD_SIZE": "3"}, "WORLD_SIZE=3 does not match devices x num_nodes = 2 x 2 = 4"),
    ],
)
def test_inconsistent_layout_is_refused_before_connecting(tmp_path: Path, env: dict[str, str], message: str) -> None:
    """Not a fault cell: a node started with a layout that contradicts the job's is refused at once."""
    outcome = run_fault(tmp_path, "layout", "--num-nodes", "2", together=False, env=env, timeout_s=60, wait_s=60)
    assert outcome.failed(), outcome.output[-3000:]
    assert message in outcome.output
    assert "Initializing distributed" not in outcome.output  # refused before any rendezvous
    assert not outcome.left, outcome.left


def _losses(outcome: Outcome, rank: int = 0) -> dict[int, float]:
    return {int(step): loss for step, loss in outcome.records[rank]["losses"].items()}


def _run_until_save_hangs(tmp_path: Path, name: str, *args: str) -> Outcome:
    """Start a job that hangs in the middle of a save, wait for it, then SIGKILL the whole job."""
    out = tmp_path / name
    marker = uuid.uuid4().hex
    env = {MARKER: marker, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with Job(env=env) as job:
        job.spawn([PYTHON, str(SCRIPT), "--out", str(out), "--timeout", str(TIMEOUT_S), "--start-together", *args],
                  tmp_path / f"{name}.log")
        end = time.monotonic() + STARTUP_S + 60
        while not list(out.glob("saving.*")) and time.monotonic() < end and job.procs[0].poll() is None:
            time.sleep(0.2)
        job.kill()  # SIGKILL to the whole process group, mid-save
        result = Result(job.procs[0].returncode, (tmp_path / f"{name}.log").read_text(errors="replace"), 0.0)
    left = processes_left(marker)
    kill_all(left)
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    saving = [p.read_text() for p in out.glob("saving.*")]
    assert saving, f"the job never reached the save it should hang in:\n{result.output[-3000:]}"
    return Outcome([result.returncode], result.output + "\n".join(saving), None, sorted(left.values()), records)


@pytest.mark.parametrize(("strategy", "hang_after_files"), [
    pytest.param("fsdp", "1", id="fsdp-sharded-after-1-file"),
    pytest.param("ddp", None, id="ddp-single-file-half-written"),
    pytest.param("deepspeed", "-1", id="deepspeed-before-commit", marks=full),
    pytest.param("fsdp2", "1", id="fsdp2-after-1-file", marks=full),
])
def test_kill_mid_save_keeps_the_previous_checkpoint_and_preemption_resumes_exactly(
        tmp_path: Path, strategy: str, hang_after_files: str | None) -> None:
    """Four jobs sharing one checkpoint directory (1 node x 2, 4 steps per epoch, a checkpoint every 4 steps).

    A: killed (SIGKILL, whole job) in the middle of the step-8 save (a sharded one after some of its
       files; a single file half written) -> ``last.ckpt`` is the complete step-4 checkpoint.
       B: resumes from it to step 12 -> steps 4..7 reproduce A's on every rank.
    P: a fresh run gets SIGTERM during step 7 -> saves ``preempted.ckpt`` after it (step 8, the end of
       an epoch: Lightning restarts a non-resumable data loader at the start of its epoch), exits 0.
       R: resumes from it -> steps 8..11 reproduce B's, steps 0..7 of P reproduce A's.
    FSDP runs P and R only with ``ANYACCEL_FAULT_MATRIX_FULL=1``: its preemption is the DDP cell's
    code path (the same callback) with the sharded save that A and B cover.
    """
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    ckpt = tmp_path / "ckpt"
    common = ["--strategy", strategy, "--ckpt-dir", str(ckpt), "--save-every", "4", "--max-steps", "12"]
    hang = ["--hang-save-at", "8", *(["--hang-after-files", hang_after_files] if hang_after_files else [])]
    killed = _run_until_save_hangs(tmp_path, "killed", *common, *hang)
    write_record(f"killsave-trainer-{strategy}-popen", "SIGKILL job mid-save", strategy, "trainer", "popen", 1,
                 killed, "the previous checkpoint stays complete; resume reproduces the losses")
    assert not killed.left, killed.left
    staged = list(ckpt.glob(".*.anyaccel-tmp"))
    assert staged, f"the kill did not happen during a save: {sorted(p.name for p in ckpt.iterdir())}"
    last = ckpt / "last.ckpt"
    assert last.exists() and not (ckpt / "epoch=1-step=8.ckpt").exists(), sorted(p.name for p in ckpt.iterdir())
    if last.is_file():  # a single file: it loads, and it is the previous checkpoint
        assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4

    resumed = run_fault(tmp_path, "resumed", *common, "--resume", str(last))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert not resumed.left
    assert not list(ckpt.glob(".*.anyaccel-tmp")), "the next save should clear the killed save's leftovers"
    ranks = sorted(killed.records)
    assert ranks == [0, 1] and sorted(resumed.records) == ranks, (sorted(killed.records), sorted(resumed.records))
    for rank in ranks:
        reference, after = _losses(killed, rank), _losses(resumed, rank)
        assert sorted(after) == list(range(4, 12)), sorted(after)
        assert after == pytest.approx({s: reference[s] for s in range(4, 8)} | {s: after[s] for s in range(8, 12)},
                                      rel=1e-5)
    if strategy == "fsdp" and not FULL_MATRIX:
        return

    preempt_dir = tmp_path / "preempt"
    preempted = run_fault(tmp_path, "preempted", *common[:2], "--ckpt-dir", str(preempt_dir), "--save-every", "100",
                          "--max-steps", "12", "--fault", "term", "--fault-step", "7")
    write_record(f"sigterm-trainer-{strategy}-popen", "SIGTERM (preemption)", strategy, "trainer", "popen", 1,
                 preempted, "checkpoint saved, clean exit 0, exact resume", clean_exit=True)
    assert preempted.returncode == 0, preempted.output[-3000:]
    assert not preempted.left, preempted.left
    assert "received SIGTERM; saving" in preempted.output
    assert (preempt_dir / "preempted.ckpt").exists()
    requeued = run_fault(tmp_path, "requeued", *common[:2], "--ckpt-dir", str(preempt_dir), "--save-every", "100",
                         "--max-steps", "12", "--resume", str(preempt_dir / "preempted.ckpt"))
    assert requeued.returncode == 0, requeued.output[-3000:]
    for rank in ranks:
        before, rest = _losses(preempted, rank), _losses(requeued, rank)
        reference, after = _losses(killed, rank), _losses(resumed, rank)
        assert sorted(before) == list(range(8)) and sorted(rest) == list(range(8, 12)), (sorted(before), sorted(rest))
        assert before == pytest.approx({s: reference[s] for s in range(8)}, rel=1e-5)
        assert rest == pytest.approx({s: after[s] for s in range(8, 12)}, rel=1e-5)


def test_control_a_direct_writer_leaves_a_broken_checkpoint(tmp_path: Path) -> None:
    """Proves the kill of the DDP cell above really hits mid-write: without the atomic writer the checkpoint is broken."""
    ckpt = tmp_path / "ckpt"
    killed = _run_until_save_hangs(tmp_path, "direct", "--strategy", "ddp", "--io", "direct", "--ckpt-dir", str(ckpt),
                                   "--save-every", "4", "--max-steps", "12", "--hang-save-at", "8")
    assert not killed.left, killed.left
    broken = [p for p in ckpt.glob("*.ckpt") if not _loads(p)]
    assert broken, "a direct writer killed mid-save should leave a truncated file"


def _loads(path: Path) -> bool:
    try:
        torch.load(path, map_location="cpu", weights_only=False)
    except Exception:
        return False
    return True
