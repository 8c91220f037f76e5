"""all_reduce bandwidth of the device's collective backend, next to single-device copy speed.

Two processes on 127.0.0.1 join a process group with the backend
:func:`lightning_anyaccel.resolve_backend` picks (gloo on CPU, nccl on CUDA, xccl on XPU, ...)
and all-reduce float32 tensors from 4 KiB to 64 MiB. Reported per size, as in nccl-tests:

- ``algbw`` = bytes / time per all_reduce;
- ``busbw`` = algbw x 2(n-1)/n, comparable across process counts (equal to algbw for n = 2).

``memcpy`` is ``dst.copy_(src)`` on one device, bytes copied / time (each byte is read once and
written once): the speed a collective between processes of one machine cannot beat.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import bench_env, processes_possible, run_ranks, seconds_per_call, summarize
from lightning_anyaccel.device.devices import device_of
from lightning_anyaccel.kit.tools.local_runs import free_port

DEFAULT_SIZES: tuple[int, ...] = tuple(4**k * 1024 for k in range(1, 9))  # 4 KiB .. 64 MiB
QUICK_SIZES: tuple[int, ...] = (4096, 262144, 4194304)


def memcpy(device: torch.device, sizes: Sequence[int], trials: int = 3) -> list[dict[str, Any]]:
    """Seconds per ``dst.copy_(src)`` on ``device`` for each size (``trials`` timings each)."""
    from benchmarks._collective_worker import iterations

    rows = []
    for nbytes in sizes:
        src = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        iters = 4 * iterations(nbytes)
        dst.copy_(src)
        seconds = seconds_per_call(lambda: dst.copy_(src), device, iters, trials)
        rows.append({"bytes": src.numel() * 4, "iterations": iters, "seconds": seconds})
    return rows


def _bandwidths(rows: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    """Add the median time and bandwidths (GB/s = 1e9 bytes/s) to each size row."""
    for row in rows:
        t = statistics.median(row["seconds"])
        row["median_s"] = t
        row["gbps"] = row["bytes"] / t / 1e9 * factor
        row["gbps_spread"] = summarize([row["bytes"] / s / 1e9 * factor for s in row["seconds"]])
    return rows


def run(device_type: str, device_count: int, *, sizes: Sequence[int] = DEFAULT_SIZES, trials: int = 3,
        threads: int = 1, timeout: float = 240) -> dict[str, Any]:
    """Run the 2-process all_reduce sweep and the memcpy sweep; return the ``collective`` section."""
    world = processes_possible(device_type, device_count)
    device = device_of(device_type)
    torch.set_num_threads(threads)
    result: dict[str, Any] = {
        "settings": {"world_size": world, "trials": trials, "dtype": "float32", "threads_per_process": threads,
                     "address": "127.0.0.1"},
        "memcpy": _bandwidths(memcpy(device, sizes, trials), 1.0),
    }
    if world < 2:
        result["skipped"] = f"all_reduce needs 2 {device_type} devices, found {device_count}"
        return result
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "collective.json")
        env = bench_env(threads, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
        run_ranks("benchmarks._collective_worker", [
            "--sizes", ",".join(map(str, sizes)), "--trials", str(trials), "--threads", str(threads), "--out", str(out),
        ], world_size=world, timeout=timeout, env=env)
        data = json.loads(out.read_text())
    result["backend"] = data["backend"]
    result["all_reduce"] = _bandwidths(data["results"], 1.0)
    for row in result["all_reduce"]:
        row["busbw_gbps"] = row["gbps"] * 2 * (world - 1) / world
    return result
