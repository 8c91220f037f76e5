"""DDP weak scaling, 1 vs 2 processes, for a compute-bound and a communication-bound workload.

Weak scaling keeps the per-process batch fixed, so 2 processes do twice the work per step.
Efficiency = (samples/s on 2 processes) / (2 x samples/s on 1 process) = steps/s(2) / steps/s(1);
1.0 is perfect. The 1-process baseline trains with ``any_single`` (no DDP wrapper, no
collectives); 2 processes use ``AnyDDPStrategy`` (popen launcher, the device's backend).
On CPU each process uses one thread. Runs of 1 and 2 processes are interleaved.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import child_env, free_port, run_module, summarize
from benchmarks.models import COMM_BOUND, COMPUTE_BOUND, Workload, scaled


def processes_possible(device_type: str, count: int) -> int:
    """How many processes a 2-process run can have: 2 on CPU (processes), else one per device."""
    return 2 if device_type == "cpu" else min(2, count)


def _one(w: Workload, scale: float, devices: int, warmup: int, measure: int, threads: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "result.json")
        env = child_env(threads, {"MASTER_PORT": str(free_port())})
        run_module("benchmarks._ddp_worker", [
            "--workload", w.name, "--scale", str(scale), "--devices", str(devices), "--warmup", str(warmup),
            "--measure", str(measure), "--threads", str(threads), "--out", str(out),
        ], timeout=timeout, env=env)
        return json.loads(out.read_text())


def run(device_type: str, device_count: int, *, reps: int = 3, warmup: int = 3, measure: int = 20,
        scale: float = 1.0, threads: int = 1, workloads: tuple[Workload, ...] = (COMPUTE_BOUND, COMM_BOUND),
        timeout: float = 180) -> dict[str, Any]:
    """Measure both workloads at 1 and 2 processes; return the ``ddp_scaling`` section."""
    n = processes_possible(device_type, device_count)
    result: dict[str, Any] = {
        "settings": {"reps": reps, "warmup_steps": warmup, "measured_steps": measure, "threads_per_process": threads,
                     "baseline": "1 process, strategy any_single", "scaled": "2 processes, AnyDDPStrategy (popen)"},
        "workloads": {},
    }
    if n < 2:
        result["skipped"] = f"needs 2 {device_type} devices, found {device_count}"
        return result
    for base in workloads:
        w = scaled(base, scale) if scale != 1.0 else base
        samples: dict[int, list[float]] = {1: [], 2: []}
        info: dict[str, Any] = {}
        for _ in range(reps):
            for devices in (1, 2):
                rec = _one(w, scale, devices, warmup, measure, threads, timeout)
                samples[devices].append(rec["steps_per_s"])
                if devices == 2:
                    info = {"backend": rec["backend"], "device": rec["device"], "strategy": rec["strategy"]}
        per_round = [b / a for a, b in zip(samples[1], samples[2])]
        s1, s2 = summarize(samples[1]), summarize(samples[2])
        result["workloads"][w.name] = {
            "workload": w.describe(),
            "steps_per_s": {"1": s1, "2": s2},
            "samples_per_s": {"1": s1["median"] * w.batch, "2": 2 * s2["median"] * w.batch},
            "efficiency": {"of_medians": s2["median"] / s1["median"], "per_round": summarize(per_round)},
            **info,
        }
    return result
