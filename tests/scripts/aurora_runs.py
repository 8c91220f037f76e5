"""Run the Aurora-style script N times under Open MPI and count the runs that end (CPython gh-112275).

``python tests/scripts/aurora_runs.py N [--timeout S] [--out FILE]``: each run is
``/usr/bin/mpirun -n 2 python tests/scripts/aurora_train.py --strategy ddp --devices 2 --num_workers 1``
(DDP, one forked-or-not DataLoader worker per rank, as the Aurora example's users run it), in its own
session, bounded by ``--timeout`` seconds: a run still going then is counted as hung and its whole
process group is ``SIGKILL``ed. Writes one JSON line (commit, date, Python, torch, Lightning, runs,
ended, hung, failed, the seconds each run took) to stdout and to ``--out`` when given: the record the
closing note quotes is this file, written by the run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "aurora_train.py"
MPIRUN = "/usr/bin/mpirun"
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def one_run(workdir: Path, timeout: float) -> tuple[str, float]:
    """``("ended" | "failed" | "hung", seconds)`` for one launch of the script under mpirun."""
    env = {**os.environ, **OMPI_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(ROOT / "src")}
    command = [MPIRUN, "-n", "2", "--bind-to", "none", "--oversubscribe", "-x", "PYTHONPATH", "-x", "MASTER_ADDR",
               "-x", "MASTER_PORT", sys.executable, str(SCRIPT), "--strategy", "ddp", "--devices", "2",
               "--num_workers", "1", "--max_epochs", "1", "--out", str(workdir / "out")]
    start = time.monotonic()
    with open(workdir / "job.log", "wb") as log:
        job = subprocess.Popen(command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        try:
            code = job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(job.pid, signal.SIGKILL)  # the launcher's group: ranks and DataLoader workers
            except ProcessLookupError:
                pass
            job.wait()
    seconds = round(time.monotonic() - start, 1)
    if code is None:
        return "hung", seconds
    return ("ended" if code == 0 else "failed"), seconds


def versions() -> dict[str, str]:
    import lightning
    import torch

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    return {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__, "lightning": lightning.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=int)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take before it counts as hung")
    parser.add_argument("--out", type=Path, help="also write the JSON line here")
    args = parser.parse_args(argv)
    outcomes: list[tuple[str, float]] = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="aurora-run-") as folder:
            outcome = one_run(Path(folder), args.timeout)
            if outcome[0] != "ended":
                kept = Path(tempfile.gettempdir()) / f"aurora-run-{index}.log"
                kept.write_bytes((Path(folder) / "job.log").read_bytes())
        outcomes.append(outcome)
        print(f"run {index + 1}/{args.runs}: {outcome[0]} in {outcome[1]} s", file=sys.stderr, flush=True)
    kinds = [kind for kind, _ in outcomes]
    record = {**versions(), "command": "mpirun -n 2 aurora_train.py --strategy ddp --devices 2 --num_workers 1",
              "runs": len(outcomes), "ended": kinds.count("ended"), "hung": kinds.count("hung"),
              "failed": kinds.count("failed"), "timeout_s": args.timeout, "seconds": [s for _, s in outcomes],
              "host_cpus": os.cpu_count()}
    line = json.dumps(record)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")
    return 0 if record["ended"] == record["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
