"""Write ``docs/memory_per_rank.md``: memory each rank holds under DDP, FSDP, FSDP2 and DeepSpeed ZeRO 1/2/3.

Runs ``examples/shard_train.py`` (2 processes, 3 steps of Adam on an 8.4 M-parameter MLP) once per
strategy on the device the package detects (CPU here) and tabulates what each rank reported.
Run from the repository root::

    python docs/memory_table.py            # about 2-3 minutes on 2 CPU cores
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "scripts" / "shard_run.py"
OUT = ROOT / "docs" / "memory_per_rank.md"
MODEL = ["--width", "1024", "--depth", "8", "--max-steps", "3"]
ROWS = [
    ("ddp", "DDP (`any_ddp`)"),
    ("fsdp", "FSDP (`any_fsdp`)"),
    ("fsdp2", "FSDP2 (`any_fsdp2`)"),
    ("deepspeed_1", "DeepSpeed ZeRO-1"),
    ("deepspeed_2", "DeepSpeed ZeRO-2"),
    ("deepspeed_3", "DeepSpeed ZeRO-3"),
]


def run(strategy: str, out: Path) -> list[dict]:
    """Train with ``strategy`` in 2 processes; the per-rank records."""
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "ANYACCEL_DS_NO_SHM": "1"}
    subprocess.run([sys.executable, str(RUN), "--strategy", strategy, *MODEL, "--out", str(out)],
                   env=env, check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return [json.loads(p.read_text()) for p in sorted((out / strategy).glob("rank*.json"))]


def main() -> None:
    lines = [
        "| strategy | parameters held per rank | optimizer state held per rank | peak live memory per rank | vs DDP |",
        "|---|---:|---:|---:|---:|",
    ]
    ddp_peak = None
    with tempfile.TemporaryDirectory() as tmp:
        for strategy, label in ROWS:
            ranks = run(strategy, Path(tmp, strategy))
            total = ranks[0]["total_numel"]
            params = max(r["param_numel"] for r in ranks)
            state = max(r["optimizer_state_numel"] for r in ranks)
            peak = max(r["peak_mib"] for r in ranks)
            ddp_peak = ddp_peak or peak
            lines.append(f"| {label} | {params / 1e6:.2f} M ({params / total:.0%}) | {state / 1e6:.2f} M |"
                         f" {peak:.0f} MiB | {peak / ddp_peak:.0%} |")
    import deepspeed
    import lightning

    lines += [
        "",
        f"Measured by `docs/memory_table.py`: 2 processes on {platform.machine()} CPU, fp32, Adam, a"
        f" {total / 1e6:.1f} M-parameter MLP (8 layers of 1024x1024), 3 steps; torch {torch.__version__},"
        f" lightning {lightning.__version__}, deepspeed {deepspeed.__version__}. Peak live memory is the"
        " largest amount of memory in use, sampled at every step boundary, above what the rank held before"
        " building the model (host memory in use on CPU, allocated device memory on accelerators).",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
