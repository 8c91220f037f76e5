"""Failure behaviour of multi-node jobs: nothing hangs, nothing is left behind, checkpoints survive.

2 "nodes" x 2 processes on 127.0.0.1 (environment-variable launch) unless said. Every test
bounds its waits (``Job.wait``) and kills what is left in ``finally``; the bounds asserted
here are the ones documented in docs/scale_out.md.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from _cluster import PYTHON, Job, Result, alive_pids, full, kill_pids, reports, train_args
from lightning_anyaccel.tools.local_runs import free_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 10  # the strategy's timeout= in these tests
#: Python + Lightning start-up on a loaded 2-core machine, before any bound can apply.
STARTUP_S = 40


def run_nodes(tmp_path: Path, out: Path, *extra: str, nodes: tuple[int, ...] = (0, 1), port: int | None = None,
              env: dict[str, str] | None = None, wait_s: float = 120) -> list[Result]:
    job_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port or free_port()), **(env or {})}
    with Job(env=job_env) as job:
        for node in nodes:
            job.spawn([PYTHON, *train_args(out, *extra)], tmp_path / f"node{node}.log", env={"NODE_RANK": str(node)})
        return job.wait(timeout=wait_s)


def assert_no_orphans(out: Path) -> None:
    leftovers = alive_pids(out)
    kill_pids(leftovers)
    assert not leftovers, f"processes outlived the job: {leftovers}"


def assert_all_failed(results: list[Result], within_s: float) -> str:
    summary = [(r.returncode, round(r.seconds, 1)) for r in results]
    assert all(r.returncode not in (0, None) for r in results), summary
    assert all(r.seconds < within_s for r in results), summary
    return "\n".join(r.output for r in results)


def test_killed_rank_ends_the_whole_job(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = run_nodes(tmp_path, out, "--max-epochs", "20", "--timeout", "60", "--die-rank", "3", "--die-at-step", "2")
    # documented bound: the others stop within 15 s of the death (no timeout involved)
    logs = assert_all_failed(results, within_s=STARTUP_S + 15)
    assert "Connection closed by peer" in logs or "Connection reset by peer" in logs
    for rank in (0, 1, 2):  # every survivor says which rank it is and why it stops
        assert f"[lightning_anyaccel] rank {rank}/4: a collective failed" in logs
    assert not reports(out)
    assert_no_orphans(out)


@full  # the supervision path of test_faults.py's frozen DDP popen cell (a node's launcher kills its stopped rank)
def test_frozen_rank_ends_the_job_within_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = run_nodes(tmp_path, out, "--max-epochs", "20", "--timeout", str(TIMEOUT_S),
                        "--freeze-rank", "3", "--freeze-at-step", "2")
    logs = assert_all_failed(results, within_s=STARTUP_S + TIMEOUT_S + 15)
    assert "Timed out" in logs or "timed out" in logs
    assert_no_orphans(out)  # the frozen rank too: its node's launcher kills it


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
    out = tmp_path / "out"
    port = free_port()
    with silent_server(port):
        results = run_nodes(tmp_path, out, "--timeout", str(TIMEOUT_S), port=port)
    logs = assert_all_failed(results, within_s=STARTUP_S + TIMEOUT_S + 15)
    assert "address already in use" in logs.lower() or "EADDRINUSE" in logs
    assert "the rendezvous at 127.0.0.1" in logs  # the ranks stuck in the handshake, ended by the deadline
    assert_no_orphans(out)


def test_node_that_never_arrives(tmp_path: Path) -> None:
    out = tmp_path / "out"
    results = run_nodes(tmp_path, out, "--timeout", str(TIMEOUT_S), nodes=(0,))
    logs = assert_all_failed(results, within_s=STARTUP_S + TIMEOUT_S + 15)
    assert "clients joined" in logs or "the rendezvous at 127.0.0.1" in logs or "Timed out" in logs
    assert_no_orphans(out)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NODE_RANK": "2"}, "NODE_RANK=2 but the job has num_nodes=2"),
        ({"NODE_RANK": "0", "WORLD_SIZE": "3"}, "WORLD_SIZE=3 does not match devices x num_nodes = 2 x 2 = 4"),
    ],
)
def test_inconsistent_layout_is_refused_before_connecting(tmp_path: Path, env: dict[str, str], message: str) -> None:
    out = tmp_path / "out"
    job_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **env}
    with Job(env=job_env) as job:
        job.spawn([PYTHON, *train_args(out, "--timeout", "60")], tmp_path / "node.log")
        result, = job.wait(timeout=STARTUP_S + 20)
    assert result.returncode not in (0, None)
    assert message in result.output
    assert "Initializing distributed" not in result.output  # refused before any rendezvous
    assert_no_orphans(out)


def _losses(out: Path) -> dict[int, dict[int, float]]:
    return {rank: {int(k): v for k, v in r["losses"].items()} for rank, r in reports(out).items()}


def _train_until_save_hangs(tmp_path: Path, name: str, ckpt: Path, *extra: str) -> None:
    """Start 1 node x 2, wait until rank 0 is half-way through the step-8 save, then kill the job."""
    out = tmp_path / name
    with Job(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"}) as job:
        job.spawn([PYTHON, *train_args(out, "--max-epochs", "3", "--ckpt-dir", str(ckpt), "--hang-save-at", "8",
                                       *extra, num_nodes=1)], tmp_path / f"{name}.log")
        end = time.monotonic() + 120
        while not (out / "saving").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert (out / "saving").exists(), (tmp_path / f"{name}.log").read_text()[-3000:]
        job.kill()  # SIGKILL to the whole process group, mid-write
    assert_no_orphans(out)


def test_kill_during_save_keeps_the_previous_checkpoint_and_resume_reproduces(tmp_path: Path) -> None:
    """1 node x 2 processes, 4 steps per epoch, a checkpoint per epoch (steps 4, 8, 12)."""
    reference = tmp_path / "reference"
    with Job(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"}) as job:
        job.spawn([PYTHON, *train_args(reference, "--max-epochs", "3", num_nodes=1)], tmp_path / "reference.log")
        result, = job.wait(timeout=150)
    assert result.returncode == 0, result.output[-3000:]
    expected = _losses(reference)
    assert sorted(expected[0]) == list(range(12))

    ckpt = tmp_path / "ckpt"
    _train_until_save_hangs(tmp_path, "killed", ckpt)
    assert list(ckpt.glob(".*.anyaccel-tmp")), "the kill did not happen during a save"
    last = torch.load(ckpt / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 4  # the previous checkpoint, complete

    resumed = tmp_path / "resumed"
    with Job(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"}) as job:
        job.spawn([PYTHON, *train_args(resumed, "--max-epochs", "3", "--ckpt-dir", str(ckpt),
                                       "--resume", str(ckpt / "last.ckpt"), num_nodes=1)], tmp_path / "resumed.log")
        result, = job.wait(timeout=150)
    assert result.returncode == 0, result.output[-3000:]
    got = _losses(resumed)
    for rank in (0, 1):
        assert sorted(got[rank]) == list(range(4, 12))
        assert got[rank] == pytest.approx({step: expected[rank][step] for step in range(4, 12)}, rel=1e-6)
    assert not list(ckpt.glob(".*.anyaccel-tmp")), "leftovers of the killed save were not cleaned up"


def test_control_a_direct_writer_leaves_a_broken_checkpoint(tmp_path: Path) -> None:
    """Proves the kill really hits mid-write: without the atomic writer the checkpoint is broken."""
    ckpt = tmp_path / "ckpt"
    _train_until_save_hangs(tmp_path, "direct", ckpt, "--io", "direct")
    broken = [p for p in ckpt.glob("*.ckpt") if not _loads(p)]
    assert broken, "a direct writer killed mid-save should leave a truncated file"


def _loads(path: Path) -> bool:
    try:
        torch.load(path, map_location="cpu", weights_only=False)
    except Exception:
        return False
    return True
