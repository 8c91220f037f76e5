"""``Trainer(profiler="pytorch")`` records the device's own activity (docs/profiling.md).

On the device under test (device-generic): a fit with Lightning's profiler reports the device's time per
operator where torch records the device, and on CPU the profiler is Lightning's own, unchanged. In the
default run the emulated ``npu`` (a child process) shows the device's columns filled, and the same device
without an activity profiler (``noprofiler``: a torch that records no device activity) says so in one line
and profiles the host.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from conftest import AUTOLOAD, LEAN_IMPORTS, ROOT, SRC, TESTS, run_python

#: The line the package logs where torch records no activity of the device (device/profiling.py).
HOST_ONLY = "records no {device} activity"


def profile_fit(root: Path, accelerator: Any = "any", **profiler_kwargs: Any) -> dict[str, Any]:
    """Fit the demo model for 6 steps under ``PyTorchProfiler``; what the profiler chose, recorded and wrote."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.profilers import PyTorchProfiler

    from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

    profiler = PyTorchProfiler(dirpath=root, filename="report", row_limit=-1, **profiler_kwargs)
    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=6, profiler=profiler, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=root)
    from lightning_anyaccel import _lightning

    chosen = {"activities": sorted(a.name for a in _lightning.profiler_kwargs(profiler)["activities"]),
              "sort_by": profiler._sort_by_key}
    trainer.fit(DemoModel(), demo_loader())
    events = profiler.function_events
    ops = [{"name": e.key, "cpu_total": e.cpu_time_total, "device_total": e.device_time_total,
            "self_device": e.self_device_time_total, "count": e.count}
           for e in (events.key_averages() if events is not None else [])]
    return {**chosen, "device": trainer.strategy.root_device.type, "ops": ops,
            "report": "".join(p.read_text() for p in root.glob("*report*.txt")),
            "traces": [p.read_text() for p in root.glob("*.pt.trace.json")]}


@pytest.mark.device_generic
@pytest.mark.feature("profiling")
def test_trainer_profiler_records_the_device(tmp_path, request, device, device_type):
    """The device's time per operator where torch records the device; on CPU, Lightning's profiler unchanged."""
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.device.profiling import profiler_plan
    from lightning_anyaccel.kit.emulator.names import BUILTIN_TYPES

    if device.emulated and device_type in BUILTIN_TYPES:
        pytest.skip(f"the emulated {device_type} records no device activity: torch records {device_type} through"
                    " its vendor's profiling library (docs/emulator.md)")
    result = profile_fit(tmp_path)
    assert result["device"] == device_type
    if get_spec(device_type).host:  # as Lightning's own CPU accelerator profiles it
        lightning_own = profile_fit(tmp_path / "lightning", accelerator="cpu")
        assert (result["activities"], result["sort_by"]) == (lightning_own["activities"], lightning_own["sort_by"])
        assert "Self CPU" in result["report"] and "CUDA" not in result["report"]
        return
    if len(profiler_plan(device_type).activities) == 1:  # this torch records no activity of the device
        assert (result["activities"], result["sort_by"]) == (["CPU"], "cpu_time_total"), result
        # the host's time only: this run shows the fallback, not the device's profiling (no feature credit)
        request.node.user_properties[:] = [p for p in request.node.user_properties if p[0] != "anyaccel_features"]
        return
    check_device_time(result, device_type)


def check_device_time(result: dict[str, Any], device_type: str) -> None:
    """The report has the device's columns, sorted by its time; operators' device time is there, within their host
    time."""
    label = device_type.upper()
    assert result["sort_by"] == "device_time_total" and len(result["activities"]) == 2, result
    assert f"Self {label}" in result["report"] and f"{label} total" in result["report"], result["report"][:3000]
    on_device = [op for op in result["ops"] if op["name"].startswith("aten::") and op["device_total"] > 0]
    assert {"aten::addmm", "aten::mse_loss"} <= {op["name"] for op in on_device}, result["ops"]
    for op in on_device:  # the emulator's kernels run inside their operator: never longer than it (1 us of rounding)
        assert op["device_total"] <= op["cpu_total"] + 1.0 * op["count"], op
    assert sum(op["self_device"] for op in result["ops"]) > 0
    assert result["traces"] and all('"cat": "kernel"' in t for t in result["traces"]), "no device row in the trace"


SCRIPT = """
import json, sys
from pathlib import Path
from test_profiling import fabric_device_time, profile_fit
print("RESULT " + json.dumps({**profile_fit(Path(sys.argv[1])), "fabric_device_us": fabric_device_time()}))
"""


def fabric_device_time() -> float:
    """A Fabric loop under ``torch.profiler`` with ``profiler_activities(fabric.device)``: the device's microseconds."""
    import torch
    from lightning.fabric import Fabric

    from lightning_anyaccel import profiler_activities

    fabric = Fabric(accelerator="any", devices=1)
    model = fabric.setup_module(torch.nn.Linear(64, 8))
    with torch.profiler.profile(activities=profiler_activities(fabric.device)) as prof:
        fabric.backward(model(torch.randn(32, 64, device=fabric.device)).sum())
    return float(sum(e.self_device_time_total for e in prof.key_averages()))


@pytest.mark.parametrize("spec", ["npu:1", "npu:1:noprofiler"])
def test_emulated_npu_reports_its_time_or_says_it_can_not(tmp_path, spec):
    """The emulated npu registers a Kineto activity profiler as a native backend does: the fit's report has
    "Self NPU"/"NPU total" filled, and a Fabric loop under torch.profiler with ``profiler_activities`` records the
    device's time. Without it, one line says the profiler records the host only."""
    env = {**{k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"},
           "LIGHTNING_ANYACCEL_EMULATE": spec, "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), str(TESTS), str(SRC), str(LEAN_IMPORTS)])}
    proc = run_python(["-c", SCRIPT, str(tmp_path)], env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["device"] == "npu"
    lines = [line for line in proc.stdout.splitlines() if HOST_ONLY.format(device="npu") in line]
    if "noprofiler" in spec:
        assert len(lines) == 1 and result["activities"] == ["CPU"], proc.stdout[-4000:]
        assert "Self NPU" not in result["report"], result["report"][:3000]
        shown = (ROOT / "docs" / "profiling.md").read_text().split("```text\n", 1)[1].split("\n```", 1)[0]
        assert lines[0].strip().endswith(shown), (lines[0], shown)  # the page shows the line as it is logged
        assert result["fabric_device_us"] == 0
        return
    assert not lines
    check_device_time(result, "npu")
    assert result["fabric_device_us"] > 0

