"""Shared helpers: machine/version metadata, statistics, device sync, bounded subprocesses.

Nothing here branches on a device name: device facts come from
:mod:`lightning_anyaccel.device.devices` and :mod:`lightning_anyaccel.device.runtime`.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
SCHEMA = "lightning-anyaccel-bench/1"


def results_for(device_type: str) -> Path:
    """The results file of a device type: ``benchmarks/results/<type>.json``."""
    return RESULTS_DIR / f"{device_type}.json"


def bench_env(threads: int = 1, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for benchmark subprocesses: this checkout importable, ``threads`` intra-op threads,
    warnings off, collectives on the loopback device (:func:`lightning_anyaccel.kit.tools.local_runs.child_env`)."""
    from lightning_anyaccel.kit.tools.local_runs import child_env  # imported when used: the report needs no torch

    return child_env(threads, import_paths=(ROOT, ROOT / "src"), loopback=True, PYTHONWARNINGS="ignore",
                     **(extra or {}))


def processes_possible(device_type: str, count: int) -> int:
    """Processes for a 2-process run: 2 on CPU, else one per device (at most 2; 1 on a one-GPU machine)."""
    return 2 if device_type == "cpu" else min(2, count)


class BenchError(RuntimeError):
    """A benchmark subprocess failed or ran past its time limit."""


def run_module(module: str, args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``python -m <module> <args>`` from the repository root with a hard timeout.

    On timeout the whole process group (DDP children included) is killed.

    Raises:
        BenchError: non-zero exit or timeout, with the tail of the output.
    """
    from lightning_anyaccel.kit.tools.local_runs import run_bounded  # imported when used: the report needs no torch

    try:
        proc = run_bounded([sys.executable, "-m", module, *args], timeout=timeout, cwd=ROOT, env=env or bench_env())
    except subprocess.TimeoutExpired as late:
        raise BenchError(f"{module} {' '.join(args)} did not finish in {timeout:.0f}s:\n{(late.output or '')[-3000:]}") \
            from None
    if proc.returncode != 0:
        raise BenchError(f"{module} {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout[-3000:]}")
    return proc.stdout


def run_ranks(module: str, args: Sequence[str], *, world_size: int, timeout: float,
              env: dict[str, str]) -> list[str]:
    """Start ``python -m <module> --rank R <args>`` for every rank at once and wait for all (bounded).

    Raises:
        BenchError: a rank failed or the group ran past ``timeout`` (then every rank is killed).
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, "--rank", str(rank), "--world-size", str(world_size), *args],
            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        for rank in range(world_size)
    ]
    deadline = time.monotonic() + timeout
    outputs: list[str] = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.communicate()
        raise BenchError(f"{module}: {world_size} ranks did not finish in {timeout:.0f}s") from None
    failed = [(rank, p.returncode, out) for rank, (p, out) in enumerate(zip(procs, outputs)) if p.returncode != 0]
    if failed:
        rank, code, out = failed[0]
        raise BenchError(f"{module}: rank {rank} exited with {code}:\n{out[-3000:]}")
    return outputs


def quiet_bench() -> None:
    """Silence Lightning's per-fit info lines ("GPU available: ...") and every warning (timings only)."""
    from lightning_anyaccel.kit.tools.local_runs import quiet_lightning

    quiet_lightning(logging.ERROR, all_warnings=True)


def synchronize(device: Any) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU), through the generic device module."""
    import torch

    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec

    device = torch.device(device)
    if device.type == "cpu":
        return
    sync = getattr(runtime.device_module(get_spec(device.type)), "synchronize", None)
    if callable(sync):
        sync()


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median and spread of ``values``: quartiles, min/max and the IQR relative to the median."""
    data = sorted(float(v) for v in values)
    if not data:
        return {"n": 0}
    median = statistics.median(data)
    if len(data) >= 4:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    else:
        q1, q3 = data[0], data[-1]
    return {
        "n": len(data),
        "median": median,
        "q1": q1,
        "q3": q3,
        "min": data[0],
        "max": data[-1],
        "iqr_rel": (q3 - q1) / median if median else None,
        "values": [float(v) for v in values],
    }



def interleave(variants: dict[str, Any], reps: int, first: int = 0) -> tuple[dict[str, list[float]], dict[str, list[float]], str]:
    """Run each variant once per round, round after round, so that load drifts hit all alike.

    ``variants`` maps a name to ``fn(rep) -> (steps per wall-second, steps per CPU-second)``; the
    rounds are numbered from ``first``. Returns the wall and CPU samples per variant and the order
    of the first two rounds (for the report).
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    cpu_samples: dict[str, list[float]] = {name: [] for name in variants}
    order: list[str] = []
    for rep in range(first, first + reps):
        for name, fn in variants.items():
            wall, cpu = fn(rep)
            samples[name].append(wall)
            cpu_samples[name].append(cpu)
            order.append(name)
    return samples, cpu_samples, ", ".join(order[: 2 * len(variants)]) + ", ..."


def plugin_ratios(samples: dict[str, list[float]], cpu_samples: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """``plugin/builtin`` and ``plugin/plain``, for the anchors that ran, from interleaved samples."""
    ratios: dict[str, dict[str, Any]] = {}
    for other in ("builtin", "plain"):
        if other in samples:
            plugin, anchor = summarize(samples["plugin"]), summarize(samples[other])
            ratios[f"plugin/{other}"] = {
                "of_medians": plugin["median"] / anchor["median"],
                # load only ever slows a run down, so the fastest run of each variant is the least disturbed
                "of_best": plugin["max"] / anchor["max"],
                "per_round": summarize([a / b for a, b in zip(samples["plugin"], samples[other])]),
                # steps per CPU-second of the process: what the code costs, whoever else runs
                "cpu_per_round": summarize([a / b for a, b in zip(cpu_samples["plugin"], cpu_samples[other])]),
            }
    return ratios

def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages, where the OS reports them."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device_type: str) -> dict[str, Any]:
    """What the results file says about the device: type, name, count, collective backend."""
    import torch

    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.device.distributed import BackendError, resolve_backend

    spec = get_spec(device_type)
    info: dict[str, Any] = {"type": device_type, "table_name": spec.name, "count": runtime.device_count(spec)}
    try:
        info["backend"] = resolve_backend(torch.device(device_type))
    except BackendError as err:
        info["backend"] = None
        info["backend_error"] = str(err)
    name = cpu_model() if device_type == "cpu" else None
    if name is None:
        get_name = getattr(runtime.device_module(spec), "get_device_name", None)
        name = str(get_name(0)) if callable(get_name) else spec.name
    info["name"] = name
    info["lightning_builtin"] = spec.lightning_builtin
    return info


def source_revision() -> dict[str, Any]:
    """The commit the benchmarks ran from, as validation records name it (:func:`lightning_anyaccel.kit.tools.records.provenance`).

    ``$LIGHTNING_ANYACCEL_COMMIT`` comes first (a copy of the checkout sent to another machine may carry a
    ``.git`` of an older commit), then ``git``; ``{"commit": None}`` when neither tells.
    """
    from lightning_anyaccel.kit.tools.records import provenance

    found = provenance(ROOT)
    known = found["commit"] != "unknown"
    return {"commit": found["commit"] if known else None, "clean": found["tree_clean"] if known else None,
            "from": found["commit_source"] if known else None}


def device_versions(device_type: str) -> dict[str, str]:
    """The device runtime torch was built for and the driver, where torch or the vendor's library tells."""
    import torch

    versions = {f"{name}_runtime": str(value) for name in ("cuda", "hip", "xpu")
                if (value := getattr(torch.version, name, None))}
    try:  # NVIDIA's management library (nvidia-ml-py) names the driver; other vendors' builds lack it
        import pynvml

        pynvml.nvmlInit()
        versions["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        pass
    return versions


def metadata(device_type: str) -> dict[str, Any]:
    """Machine, versions, device and date for a results file."""
    import lightning
    import psutil
    import torch

    import lightning_anyaccel

    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu_model": cpu_model(),
            "cpu_cores_logical": os.cpu_count(),
            "cpu_cores_physical": psutil.cpu_count(logical=False),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "os": f"{platform.system()} {platform.release()}",
            "arch": platform.machine(),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "lightning_anyaccel": lightning_anyaccel.__version__,
            **device_versions(device_type),
        },
        "source": source_revision(),
        "device": device_info(device_type),
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` atomically (a ``.tmp`` file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def now() -> float:
    """Monotonic seconds for durations inside one process."""
    return time.perf_counter()


def seconds_per_call(call: Callable[[], object], device: Any, iterations: int, trials: int,
                     before_each: Callable[[], object] | None = None) -> list[float]:
    """``trials`` timings of ``iterations`` calls of ``call`` on ``device``, each in seconds per call.

    The device's queue is drained before and after each trial (:func:`synchronize`);
    ``before_each`` runs ahead of each trial, outside the timing (a barrier, for collectives).
    """
    seconds = []
    for _ in range(trials):
        if before_each is not None:
            before_each()
        synchronize(device)
        start = now()
        for _ in range(iterations):
            call()
        synchronize(device)
        seconds.append((now() - start) / iterations)
    return seconds
