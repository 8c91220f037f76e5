"""The fault matrix: every fault ends the whole job within its bound, and no checkpoint is lost.

Each test starts one job of ``tests/scripts/fault_train.py`` (1 node x 2 processes on CPU unless
said) with a unique marker variable, injects one fault, and asserts:

- the job ends with a non-zero status (or 0 for preemption, which is a clean stop);
- it ends within the strategy's ``timeout`` plus :data:`BOUND_S` after the fault;
- no process carrying the marker is left (stopped ones included, found through ``/proc``);
- the log names the rank and the cause.

Every test writes a record (fault, strategy, launcher, nodes, seconds to end, processes left) to
``build/fault_records/`` (or ``$ANYACCEL_FAULT_RECORDS``); ``docs/fault_table.py`` turns the
records of the last run into ``docs/fault_matrix.md``, which also lists which test covers which
cell. Combinations that only repeat a covered code path run only with
``ANYACCEL_FAULT_MATRIX_FULL=1`` (the page says why CI skips them).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from _cluster import PYTHON, ROOT, Job, Result, full
from lightning_anyaccel.tools.local_runs import free_port

SCRIPT = ROOT / "tests" / "scripts" / "fault_train.py"
#: The strategy's timeout in these jobs (seconds). The ranks enter the rendezvous together
#: (``--start-together``), so a slow start on a loaded machine does not count against it, except
#: in the "never arrives" cell, where the rendezvous itself is under test.
TIMEOUT_S = int(os.environ.get("ANYACCEL_FAULT_TIMEOUT_S", "15"))
#: What the package promises beyond the timeout: the job is gone within ``timeout + BOUND_S``
#: seconds of the fault (docs/fault_matrix.md). Measured figures are in the records.
BOUND_S = 30
#: Python + Lightning start-up on a loaded machine, before the fault can happen.
STARTUP_S = float(os.environ.get("ANYACCEL_FAULT_STARTUP_S", "90"))
MARKER = "ANYACCEL_FAULT_JOB"
RECORDS = Path(os.environ.get("ANYACCEL_FAULT_RECORDS", ROOT / "build" / "fault_records"))

pytestmark = pytest.mark.slow


@dataclass
class Outcome:
    """How one fault job ended."""

    returncode: int | None
    output: str
    seconds_after_fault: float | None
    left: list[str] = field(default_factory=list)
    records: dict[int, dict] = field(default_factory=dict)


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


def run_fault(tmp_path: Path, name: str, *args: str, env: dict[str, str] | None = None,
              wait_s: float = STARTUP_S + TIMEOUT_S + BOUND_S, command: list[str] | None = None) -> Outcome:
    """Run one job of the fault script; kill what is left after ``wait_s`` (and report it)."""
    out = tmp_path / name
    marker = uuid.uuid4().hex
    job_env = {MARKER: marker, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **(env or {})}
    command = command or [PYTHON, str(SCRIPT)]
    with Job(env=job_env) as job:
        together = [] if "absent" in args else ["--start-together"]
        job.spawn([*command, "--out", str(out), "--timeout", str(TIMEOUT_S), *together, *args], tmp_path / f"{name}.log")
        result, = job.wait(timeout=wait_s)
        ended = time.time()
        time.sleep(1.0)  # let the kernel finish delivering the last SIGKILLs
        left = job_processes(marker)
    for pid in left:  # never leave anything behind, whatever the assertions say
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    fault_at = min((float(p.read_text()) for p in out.glob("fault.*")), default=None) if out.exists() else None
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")} if out.exists() else {}
    return Outcome(result.returncode, result.output, None if fault_at is None else ended - fault_at,
                   sorted(left.values()), records)


def write_record(cell: str, fault: str, strategy: str, frontend: str, launcher: str, nodes: int,
                 outcome: Outcome, expected: str, bound_s: float | None = None, clean_exit: bool = False) -> None:
    """The record ``docs/fault_table.py`` reads; ``ok``: ended as promised (status, bound, nothing left)."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    bound_s = bound_s or TIMEOUT_S + BOUND_S
    status_ok = outcome.returncode == 0 if clean_exit else outcome.returncode not in (0, None)
    in_time = outcome.seconds_after_fault is None or outcome.seconds_after_fault <= bound_s
    record = {
        "cell": cell, "fault": fault, "strategy": strategy, "frontend": frontend, "launcher": launcher,
        "nodes": nodes, "timeout_s": TIMEOUT_S, "bound_s": bound_s, "expected": expected,
        "ok": status_ok and in_time and not outcome.left,
        "returncode": outcome.returncode,
        "seconds_after_fault": None if outcome.seconds_after_fault is None else round(outcome.seconds_after_fault, 1),
        "processes_left": len(outcome.left), "torch": torch.__version__, "when": time.strftime("%Y-%m-%d"),
    }
    (RECORDS / f"{cell}.json").write_text(json.dumps(record, indent=1))


def assert_failed_cleanly(outcome: Outcome, *log_says: str, bound_s: float = TIMEOUT_S + BOUND_S) -> None:
    """Non-zero status, within the bound after the fault, nothing left, the log names rank and cause."""
    tail = outcome.output[-4000:]
    assert outcome.returncode not in (0, None), f"status {outcome.returncode}\n{tail}"
    assert not outcome.left, f"processes outlived the job: {outcome.left}\n{tail}"
    assert outcome.seconds_after_fault is not None, f"the fault was never injected\n{tail}"
    assert outcome.seconds_after_fault <= bound_s, f"{outcome.seconds_after_fault:.0f} s\n{tail}"
    for text in log_says:
        assert text in outcome.output, f"{text!r} not in the log\n{tail}"


def names_rank(output: str, rank: int) -> bool:
    """Whether the log names ``rank`` as the one that failed (Lightning's, torch's or the package's wording)."""
    return any(text in output for text in (f"[rank{rank}]", f"rank {rank}/", f"Process {rank} terminated"))


FROZEN = [
    # (cell, frontend, strategy, launcher, frozen rank), all with SIGSTOP at step 2
    pytest.param("stop-trainer-ddp-popen", "trainer", "ddp", "popen", 1, id="trainer-ddp-popen"),
    pytest.param("stop-rank0-trainer-ddp-popen", "trainer", "ddp", "popen", 0, id="rank0-trainer-ddp-popen",
                 marks=full),
    pytest.param("stop-trainer-ddp-spawn", "trainer", "ddp", "spawn", 1, id="trainer-ddp-spawn"),
    pytest.param("stop-fabric-ddp-popen", "fabric", "ddp", "popen", 1, id="fabric-ddp-popen", marks=full),
    pytest.param("stop-trainer-deepspeed-popen", "trainer", "deepspeed", "popen", 1, id="trainer-deepspeed-popen"),
    pytest.param("stop-trainer-ddp-fork", "trainer", "ddp", "fork", 1, id="trainer-ddp-fork", marks=full),
    pytest.param("stop-trainer-fsdp-popen", "trainer", "fsdp", "popen", 1, id="trainer-fsdp-popen", marks=full),
    pytest.param("stop-trainer-fsdp2-popen", "trainer", "fsdp2", "popen", 1, id="trainer-fsdp2-popen", marks=full),
    pytest.param("stop-fabric-fsdp-popen", "fabric", "fsdp", "popen", 1, id="fabric-fsdp-popen", marks=full),
    pytest.param("stop-trainer-ddp-torchrun", "trainer", "ddp", "torchrun", 1, id="trainer-ddp-torchrun", marks=full),
]
#: torchrun's agent sends SIGTERM, waits 30 s, then SIGKILLs (torch's ``PContext.close``).
TORCHRUN_EXTRA_S = 30


@pytest.mark.parametrize(("cell", "frontend", "strategy", "launcher", "rank"), FROZEN)
def test_frozen_rank_ends_the_job_and_is_killed(tmp_path: Path, cell: str, frontend: str, strategy: str,
                                                launcher: str, rank: int) -> None:
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
                        start_method, "--fault", "stop", "--fault-rank", str(rank), command=command,
                        wait_s=STARTUP_S + bound)
    write_record(cell, f"SIGSTOP rank {rank}", strategy, frontend, launcher, 1, outcome,
                 "the others time out; the stopped rank is SIGKILLed", bound_s=bound)
    assert_failed_cleanly(outcome, f"rank {rank}: injecting stop", "Timed out", bound_s=bound)
    assert names_rank(outcome.output, 1 - rank), "the log does not say which rank timed out"
    if launcher in ("spawn", "fork") or rank == 0:  # the package's own kill, not only the kernel's
        assert "[lightning_anyaccel] killed process" in outcome.output


@full
def test_killed_rank_ends_the_job(tmp_path: Path) -> None:
    outcome = run_fault(tmp_path, "kill-trainer-ddp-popen", "--fault", "kill")
    write_record("kill-trainer-ddp-popen", "SIGKILL rank 1", "ddp", "trainer", "popen", 1, outcome,
                 "the others fail at once (connection closed)")
    assert_failed_cleanly(outcome, "rank 1: injecting kill")
    assert "Child process with PID" in outcome.output or "Connection closed by peer" in outcome.output


@full
def test_raise_in_training_step_ends_the_job(tmp_path: Path) -> None:
    outcome = run_fault(tmp_path, "raise-fabric-ddp-spawn", "--frontend", "fabric", "--start-method", "spawn",
                        "--fault", "raise")
    write_record("raise-fabric-ddp-spawn", "raise in training_step (rank 1)", "ddp", "fabric", "spawn", 1,
                 outcome, "the error is raised in the launching process; the others are ended")
    assert_failed_cleanly(outcome, "injected fault: training_step raised on rank 1")


@full
def test_rank_that_never_arrives(tmp_path: Path) -> None:
    outcome = run_fault(tmp_path, "absent-trainer-fsdp-popen", "--strategy", "fsdp", "--fault", "absent")
    write_record("absent-trainer-fsdp-popen", "rank 1 never arrives", "fsdp", "trainer", "popen", 1, outcome,
                 "the rendezvous times out; the stopped rank is SIGKILLed")
    assert_failed_cleanly(outcome, "rank 1: stopping before the rendezvous", "1/2 clients joined")


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
    time.sleep(1.0)
    left = job_processes(marker)
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    saving = [p.read_text() for p in out.glob("saving.*")]
    assert saving, f"the job never reached the save it should hang in:\n{result.output[-3000:]}"
    return Outcome(result.returncode, result.output + "\n".join(saving), None, sorted(left.values()), records)


@pytest.mark.parametrize(("strategy", "hang_after_files"), [
    pytest.param("fsdp", "1", id="fsdp-sharded-after-1-file"),
    pytest.param("deepspeed", "-1", id="deepspeed-before-commit", marks=full),
    pytest.param("fsdp2", "1", id="fsdp2-after-1-file", marks=full),
])
def test_kill_mid_save_keeps_the_previous_checkpoint_and_preemption_resumes_exactly(
        tmp_path: Path, strategy: str, hang_after_files: str) -> None:
    """Four jobs sharing one checkpoint directory (1 node x 2, 4 steps per epoch, a checkpoint every 4 steps).

    A: killed (SIGKILL, whole job) in the middle of the step-8 sharded save -> ``last.ckpt`` is the
       complete step-4 checkpoint. B: resumes from it to step 12 -> steps 4..7 reproduce A's.
    P: a fresh run gets SIGTERM during step 7 -> saves ``preempted.ckpt`` after it (step 8, the end of
       an epoch: Lightning restarts a non-resumable data loader at the start of its epoch), exits 0.
       R: resumes from it -> steps 8..11 reproduce B's uninterrupted ones, steps 0..7 of P reproduce A's.
    """
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    ckpt = tmp_path / "ckpt"
    common = ["--strategy", strategy, "--ckpt-dir", str(ckpt), "--save-every", "4", "--max-steps", "12"]
    killed = _run_until_save_hangs(tmp_path, "killed", *common, "--hang-save-at", "8",
                                   "--hang-after-files", hang_after_files)
    write_record(f"killsave-trainer-{strategy}-popen", "SIGKILL job mid-save", strategy, "trainer", "popen", 1,
                 killed, "the previous checkpoint stays complete; resume reproduces the losses")
    assert not killed.left, killed.left
    staged = list(ckpt.glob(".*.anyaccel-tmp"))
    assert staged, f"the kill did not happen during a save: {sorted(p.name for p in ckpt.iterdir())}"
    last = ckpt / "last.ckpt"
    assert last.exists() and not (ckpt / "epoch=1-step=8.ckpt").exists(), sorted(p.name for p in ckpt.iterdir())

    resumed = run_fault(tmp_path, "resumed", *common, "--resume", str(last))
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert not resumed.left
    assert not list(ckpt.glob(".*.anyaccel-tmp")), "the next save should clear the killed save's leftovers"
    reference, after = _losses(killed), _losses(resumed)
    assert sorted(after) == list(range(4, 12)), sorted(after)
    assert after == pytest.approx({s: reference[s] for s in range(4, 8)} | {s: after[s] for s in range(8, 12)},
                                  rel=1e-5)

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
    before, rest = _losses(preempted), _losses(requeued)
    assert sorted(before) == list(range(8)) and sorted(rest) == list(range(8, 12)), (sorted(before), sorted(rest))
    assert before == pytest.approx({s: reference[s] for s in range(8)}, rel=1e-5)
    assert rest == pytest.approx({s: after[s] for s in range(8, 12)}, rel=1e-5)
