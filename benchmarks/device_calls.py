"""Per-step calls on the run's device against CPU: does the generic path add per-step device calls?

One process trains :data:`~benchmarks.models.OVERHEAD` with ``AnyAccelerator`` and ``any_single``
twice, on the run's device and on CPU, and counts under ``cProfile`` the function calls of the
measured steps: all of them, those into the device module (``torch.get_device_module(type)``:
``torch.cuda``, ``torch.xpu``, or the module an out-of-tree backend registers), and the
functions whose per-step count differs between the two devices. Call counts are deterministic,
so this is a check of what the code does per step, not a speed claim (on an emulated device the
kernels are CPU kernels behind a dispatch layer, and their speed means nothing).

A run on CPU measures the tests' emulated PrivateUse1 device (``lightning_anyaccel.kit.emulator``) this way when the
checkout has it, in a child process started with ``python -m benchmarks --device emulated:npu``
(see :mod:`benchmarks.run`); on an accelerator the run's own device is compared with CPU.
"""

from __future__ import annotations

import inspect
import pstats
import sys
from typing import Any

import torch

from benchmarks.common import quiet_bench
from benchmarks.models import OVERHEAD, BenchModule, ProfiledSteps, Workload, make_loader


def _device_functions(device_type: str) -> set[tuple[str, int, str]]:
    """``cProfile`` keys (file, line, name) of the Python functions of the device module."""
    if device_type == "cpu":
        return set()
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec

    module = runtime.device_module(get_spec(device_type))
    keys = set()
    for value in vars(module).values():
        # not the standard library's functions it imports (``torch.cuda`` has ``typing.cast`` in its namespace)
        if not callable(value) or str(getattr(value, "__module__", "")).split(".")[0] in sys.stdlib_module_names:
            continue
        # the function itself, not a decorator's wrapper (contextmanager's ``helper`` is shared by all)
        code = getattr(inspect.unwrap(value), "__code__", None)
        if code is not None:
            keys.add((code.co_filename, code.co_firstlineno, code.co_name))
    return keys


def _profile(device_type: str, w: Workload, warmup: int, measure: int) -> dict[tuple[str, int, str], int]:
    """Calls per function over ``measure`` steps of a plugin fit on ``device_type``."""
    from lightning.pytorch import Trainer

    from lightning_anyaccel import AnyAccelerator

    torch.manual_seed(0)
    timer = ProfiledSteps(warmup, measure)
    trainer = Trainer(
        accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1, max_steps=warmup + measure,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[timer],
    )
    trainer.fit(BenchModule(w), make_loader(w, warmup + measure))
    stats = pstats.Stats(timer.profile).stats  # type: ignore[attr-defined]
    _CALLERS[device_type] = {key: value[4] for key, value in stats.items()}
    return {key: value[1] for key, value in stats.items()}


#: device type -> cProfile key -> {caller key: (cc, nc, tt, ct)}, from the last :func:`_profile`.
_CALLERS: dict[str, dict[tuple[str, int, str], dict[Any, Any]]] = {}


def _name(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    parts = filename.replace("\\", "/").split("/")
    return f"{'/'.join(parts[-2:])}:{line} {name}"


def compare(device_type: str, *, warmup: int = 5, measure: int = 20, workload: Workload = OVERHEAD,
            threads: int = 1) -> dict[str, Any]:
    """Calls per step on ``device_type`` and on CPU, device-module calls, and the functions that differ."""
    quiet_bench()
    torch.set_num_threads(threads)
    counts = {dev: _profile(dev, workload, warmup, measure) for dev in dict.fromkeys((device_type, "cpu"))}
    device_keys = _device_functions(device_type)
    on_device, on_cpu = counts[device_type], counts["cpu"]
    differ = {
        _name(key): (on_device.get(key, 0) - on_cpu.get(key, 0)) / measure
        for key in set(on_device) | set(on_cpu)
        if on_device.get(key, 0) != on_cpu.get(key, 0)
    }
    top = dict(sorted(differ.items(), key=lambda kv: -abs(kv[1]))[:15])
    callers = _CALLERS.get(device_type, {})
    by_function = {
        _name(key): {"calls": n / measure,
                     "callers": {_name(c): v[1] / measure for c, v in sorted(
                         callers.get(key, {}).items(), key=lambda kv: -kv[1][1])[:3]}}
        for key, n in sorted(on_device.items(), key=lambda kv: -kv[1]) if key in device_keys
    }
    return {
        "device": device_type,
        "workload": workload.describe(),
        "settings": {"warmup_steps": warmup, "profiled_steps": measure, "threads": threads},
        "calls_per_step": {dev: sum(c.values()) / measure for dev, c in counts.items()},
        "device_module_calls_per_step": sum(n for key, n in on_device.items() if key in device_keys) / measure,
        "device_module_functions": len(device_keys),
        "device_module_calls": by_function,
        "differing_functions_per_step": top,
        "differing_functions_total": len(differ),
        "differing_in_package": sorted(_name(k) for k in set(on_device) | set(on_cpu)
                                       if "lightning_anyaccel" in k[0] and on_device.get(k, 0) != on_cpu.get(k, 0)),
    }


#: The name the emulated device is loaded as when a CPU run measures it (a vendor type of the device table).
EMULATED_NAME = "npu"


def run(device_type: str, *, self_check: bool = False, timeout: float = 900, **kwargs: Any) -> dict[str, Any]:
    """The ``device_calls`` section.

    On an accelerator: :func:`compare` with CPU. On CPU: the same on the tests' emulated device,
    in a child process that loads it (``python -m benchmarks --device emulated:npu``), when this
    checkout has the emulator; else skipped. ``self_check`` (smoke test) compares CPU with CPU.
    """
    if device_type != "cpu" or self_check:
        return compare(device_type, **kwargs)
    from benchmarks.run import EMULATOR_AUTOLOAD

    if not EMULATOR_AUTOLOAD.is_dir():
        return {"skipped": "the run's device is CPU and this checkout has no emulated device (lightning_anyaccel.kit.emulator)"}
    import json
    import tempfile
    from pathlib import Path

    from benchmarks.common import bench_env, run_module

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "emulated.json")
        run_module("benchmarks", ["--device", f"emulated:{EMULATED_NAME}", "--only", "device_calls", "--no-report",
                                  "--out", str(out)], timeout=timeout, env=bench_env(1))
        doc = json.loads(out.read_text())
    section = doc["device_calls"]
    if "error" in section:
        raise RuntimeError(f"on the emulated device: {section['error']}")
    section["emulated"] = {"as": EMULATED_NAME, "device": doc["meta"]["device"]}
    return section
