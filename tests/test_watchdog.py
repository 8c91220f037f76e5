"""The stall watchdog's own rules (:mod:`lightning_anyaccel.cluster.watchdog`), in one process each.

The jobs of several ranks, launchers and hangs are in ``tests/test_faults_hangs.py``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_anyaccel.cluster import watchdog

PROGRAM = textwrap.dedent("""
    import sys, time
    from lightning_anyaccel.cluster import watchdog
    watchdog.start(0, "unit", float(sys.argv[1]))
    mode = sys.argv[2]
    start = time.monotonic()
    while time.monotonic() < start + 4:
        if mode == "progress-then-disarmed":  # 2 s of steps, then 2 s idle after a disarm (the Trainer's teardown)
            watchdog.progress() if time.monotonic() < start + 2 else watchdog.disarm()
        time.sleep(0.2)
    print("finished")
""")


def run(tmp_path: Path, bound: str, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {"LIGHTNING_ANYACCEL_STALL_DIR": str(tmp_path / "stacks"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(script), bound, mode], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": ":".join(sys.path)})


def test_a_stall_prints_the_stack_names_the_place_and_exits_non_zero(tmp_path: Path) -> None:
    proc = run(tmp_path, "1", "stall")
    assert proc.returncode == watchdog.EXIT_CODE, proc.stderr[-3000:]
    assert "finished" not in proc.stdout
    assert "rank 0 made no progress" in proc.stderr
    assert "rank 0 (pid" in proc.stderr and "program.py:" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "stacks" / "rank0.stack").read_text().count("File ") > 3


def test_progress_then_a_disarmed_watchdog_lets_the_process_run(tmp_path: Path) -> None:
    proc = run(tmp_path, "1", "progress-then-disarmed")
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr[-3000:]


def test_off_and_the_environment_variable() -> None:
    assert watchdog.stall_timeout(0) is None
    assert watchdog.stall_timeout(5) == 5.0
    assert watchdog.stall_timeout(None, {}) == watchdog.DEFAULT_STALL_TIMEOUT_S
    assert watchdog.stall_timeout(None, {watchdog.STALL_TIMEOUT_ENV: "0"}) is None
    with pytest.raises(ValueError, match="LIGHTNING_ANYACCEL_STALL_TIMEOUT"):
        watchdog.stall_timeout(None, {watchdog.STALL_TIMEOUT_ENV: "soon"})


def test_where_a_rank_waits() -> None:
    loader = ['  File "/x/torch/utils/data/dataloader.py", line 1 in _next_data',
              '  File "/x/torch/utils/data/dataloader.py", line 2 in _get_data']
    assert watchdog.where(loader).startswith("in a DataLoader worker's start")
    assert watchdog.where(['  File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier']) == "in barrier"
    user = ['  File "/home/me/train.py", line 42 in training_step', '  File "/x/site-packages/torch/nn/a.py", line 3 in f']
    assert watchdog.where(user) == "at /home/me/train.py:42 in training_step"
    assert watchdog.where([]) == "somewhere without a Python frame"
