"""The mechanisms that end stopped workers, each on its own (no training): fast, and they say why a cell passes.

A stopped process reacts to nothing but ``SIGKILL``. These tests stop real processes and check
that each mechanism of :mod:`lightning_anyaccel.cluster.supervision` ends them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lightning_anyaccel.cluster import supervision

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, uses prctl")


def _wait_until(predicate, timeout: float = 20) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _gone(pid: int) -> bool:
    state = supervision._proc_state(pid)
    return state is None or state == "Z"


def test_reaper_kills_a_stopped_child_that_was_asked_to_terminate() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        assert _wait_until(lambda: supervision.is_stopped(child.pid))
        assert supervision.reap_stopped_children() == []  # stopped, but nobody asked it to end
        os.kill(child.pid, signal.SIGTERM)  # what torch's spawn join sends: pending, never handled
        assert _wait_until(lambda: supervision.signal_pending(child.pid, signal.SIGTERM))
        assert supervision.reap_stopped_children() == [child.pid]
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait(timeout=10)


def _env() -> dict[str, str]:
    """The environment of a launcher script: this checkout's package first on its path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(supervision.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}


LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    from lightning_anyaccel.cluster import supervision
    supervision.prepare_launch()
    worker = subprocess.Popen([sys.executable, "-c", '''
    import os, signal, sys
    from lightning_anyaccel.cluster import supervision
    assert supervision.supervise_worker(rank=1)
    open(sys.argv[1], "w").write(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)
    ''', sys.argv[1]], env={**os.environ, "LOCAL_RANK": "1"})  # as Lightning's popen launcher sets it
    while not os.path.exists(sys.argv[1]) or not open(sys.argv[1]).read():
        time.sleep(0.05)
    time.sleep(0.5)
    if sys.argv[2] == "crash":
        os._exit(1)  # no atexit: like a launcher that was SIGKILLed
    sys.exit(1)      # a failing launcher: its atexit kills the stopped worker
""")


@pytest.mark.parametrize("how", ["crash", "exit"])
def test_a_stopped_worker_ends_with_its_launcher(tmp_path: Path, how: str) -> None:
    """``crash``: the kernel's parent-death signal; ``exit``: the launcher's own kill at exit."""
    pid_file = tmp_path / "worker.pid"
    launcher = subprocess.run([sys.executable, "-c", LAUNCHER, str(pid_file), how], env=_env(), timeout=120,
                              capture_output=True, text=True)
    assert launcher.returncode == 1, launcher.stderr[-2000:]
    worker = int(pid_file.read_text())
    try:
        assert _wait_until(lambda: _gone(worker)), f"worker {worker} outlived its launcher"
    finally:
        if not _gone(worker):
            os.kill(worker, signal.SIGKILL)
    if how == "exit":
        assert "killed process" in launcher.stderr and "(it was stopped)" in launcher.stderr


FINISHING = textwrap.dedent("""
    import os, subprocess, sys
    from lightning_anyaccel.cluster import supervision
    supervision.prepare_launch()
    subprocess.Popen([sys.executable, "-c", '''
    import sys, time
    from lightning_anyaccel.cluster import supervision
    assert supervision.supervise_worker(rank=1)
    time.sleep(6)  # a slow rank still finishing after rank 0 is done (longer than EXIT_GRACE_S)
    open(sys.argv[1], "w").write("done")
    ''', sys.argv[1]], env={**os.environ, "LOCAL_RANK": "1"})
""")


def test_a_slower_worker_finishes_after_a_successful_launcher_silently(tmp_path: Path) -> None:
    """After a successful run the launcher waits for its workers and prints nothing that reads like a failure."""
    done = tmp_path / "done"
    launcher = subprocess.run([sys.executable, "-c", FINISHING, str(done)], env=_env(), timeout=120,
                              capture_output=True, text=True)
    assert launcher.returncode == 0, launcher.stderr[-2000:]
    assert done.read_text() == "done"
    assert "killed" not in launcher.stderr, launcher.stderr


ORPHANED = textwrap.dedent("""
    import os, subprocess, sys
    from lightning_anyaccel.cluster import supervision
    supervision.prepare_launch()
    subprocess.Popen([sys.executable, "-c", '''
    import os, sys, time
    from lightning_anyaccel.cluster import supervision
    while os.getppid() == int(os.environ[supervision.LAUNCHER_PID_ENV]):
        time.sleep(0.05)  # still importing, building its Trainer, when the launcher fails
    supervision.supervise_worker(rank=1)
    open(sys.argv[1], "w").write("went on")
    ''', sys.argv[1]], env={**os.environ, "LOCAL_RANK": "1"})
    os._exit(1)
""")


def test_a_worker_whose_launcher_died_before_it_started_exits_at_once(tmp_path: Path) -> None:
    """A rank that reaches its setup after its launcher failed ends there instead of waiting for the rendezvous."""
    went_on = tmp_path / "went_on"
    launcher = subprocess.run([sys.executable, "-c", ORPHANED, str(went_on)], env=_env(), timeout=120,
                              capture_output=True, text=True)
    assert launcher.returncode == 1, launcher.stderr[-2000:]
    assert _wait_until(lambda: not _orphans(str(went_on))), "the orphaned worker is still running"
    assert not went_on.exists(), "the worker went on after its launcher died"


def _orphans(argument: str) -> list[int]:
    """Processes whose command line names ``argument`` (the orphaned worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if argument.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
