"""Shared test fixtures: subprocess runner with bounded waits, per-test thread limits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# Child processes (popen DDP re-runs the script, spawn, helper scripts) must import this
# checkout's package, not an installed copy from another tree.
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_python(args: list[str], *, timeout: float = 180, cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` with a hard timeout; on timeout the whole process group is killed."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, *args], cwd=cwd or ROOT, env=full_env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        raise AssertionError(f"python {' '.join(args)} did not finish in {timeout}s:\n{out[-4000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@pytest.fixture
def python_runner():
    """The bounded subprocess runner, as a fixture."""
    return run_python
