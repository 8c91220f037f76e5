"""Time to first step of a 2-process DDP fit, for the popen, spawn and fork launchers.

Each run starts a fresh interpreter (``benchmarks._first_step_worker``) and splits the time from
that start to the end of the first optimizer step on rank 0 into phases:

- ``import``: interpreter start plus importing torch, Lightning and the package (launching process);
- ``launch_rendezvous``: starting the other processes (popen: a new interpreter that imports
  everything again; spawn: the same for both ranks; fork: a copy of the parent) and joining the
  process group, up to rank 0's ``setup`` hook;
- ``first_step``: model to device, DDP wrapping (parameter broadcast), the first batch and step.

Launchers are interleaved (popen, spawn, fork, popen, ...).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import bench_env, processes_possible, run_module, summarize
from lightning_anyaccel.kit.tools.local_runs import free_port

START_METHODS: tuple[str, ...] = ("popen", "spawn", "fork")
PHASES: tuple[str, ...] = ("import", "launch_rendezvous", "first_step")


def fork_allowed() -> bool:
    """Whether this platform can fork (the worker never touches the device before forking)."""
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


def _one(method: str, devices: int, scale: float, timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "first_step.json")
        env = bench_env(1, {"MASTER_PORT": str(free_port())})
        env.pop("BENCH_T_IMPORTED", None)
        t0 = time.time()
        run_module("benchmarks._first_step_worker", [
            "--start-method", method, "--devices", str(devices), "--t0", repr(t0), "--scale", str(scale),
            "--out", str(out),
        ], timeout=timeout, env=env)
        rec = json.loads(out.read_text())
    return {
        "import": rec["imported"] - rec["t0"],
        "launch_rendezvous": rec["setup"] - rec["imported"],
        "first_step": rec["first_step"] - rec["setup"],
        "total": rec["first_step"] - rec["t0"],
    }


def run(device_type: str, device_count: int, *, reps: int = 3, scale: float = 1.0,
        methods: tuple[str, ...] = START_METHODS, timeout: float = 180) -> dict[str, Any]:
    """Measure every launcher in ``methods`` ``reps`` times; return the ``first_step`` section (seconds)."""
    devices = processes_possible(device_type, device_count)
    methods = tuple(m for m in methods if m != "fork" or fork_allowed())
    samples: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    for _ in range(reps):
        for method in methods:
            samples[method].append(_one(method, devices, scale, timeout))
    return {
        "settings": {"reps": reps, "processes": devices, "strategy": "AnyDDPStrategy", "threads_per_process": 1},
        "phases": list(PHASES),
        "seconds": {
            method: {phase: summarize([s[phase] for s in runs]) for phase in (*PHASES, "total")}
            for method, runs in samples.items()
        },
    }
