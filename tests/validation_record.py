"""The validation record ``pytest --validation-record PATH`` writes (see docs/validate_hardware.md).

A TOML fragment in the format ``docs/validation.toml`` reads: one ``[devices.<type>.<level>]``
table (level ``hardware`` for a real device, ``emulated`` for the emulated accelerator) with the
device's name and count, the driver/torch/vendor versions, the date, the tests that passed,
failed and were skipped, and per feature whether its tests passed. Paste it into
``docs/validation.toml`` (or send it in) and the support matrix shows it.
"""

from __future__ import annotations

import datetime
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

#: Feature -> substrings of the test names that exercise it (the support matrix's columns).
FEATURES: dict[str, tuple[str, ...]] = {
    "single_device": ("test_single_device_fit", "autocast_active_in_training_step"),
    "mixed_precision": ("bf16", "16_mixed"),
    "ddp": ("test_ddp_two_processes", "test_fabric_notebook", "machine[ddp]"),
    "fork_safety": ("fork",),
    "fsdp": ("fsdp-", "fsdp_", "machine[fsdp]", "under_test[fsdp]"),
    "fsdp2": ("fsdp2",),
    "deepspeed": ("deepspeed",),
    "checkpoint": ("checkpoint", "resume"),
    "device_stats": ("device_stats",),
    "verify": ("test_verify",),
}


#: The test that runs each distributed strategy as one process on a machine with one device: a feature
#: that passed only there is recorded as ``"passed (1 process)"``, not as a multi-process pass.
ONE_PROCESS_TEST = "test_one_process_on_a_one_device_machine"


class _Collector:
    """Collects the outcome of every test of the session (registered by conftest).

    It listens to the test reports, which under pytest-xdist (``pytest -n``) reach the controlling
    process from every worker, so one record covers the whole run.
    """

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.nodeid] = "passed" if report.passed else ("skipped" if report.skipped else "failed")


COLLECTOR = _Collector()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _device_facts(device_type: str) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__}
    if device_type == "cpu":
        facts.update(device_name=platform.processor() or platform.machine(), device_count=1)
        return facts
    module = torch.get_device_module(device_type)
    facts["device_count"] = int(module.device_count())
    name = getattr(module, "get_device_name", None)
    facts["device_name"] = str(name(0)) if callable(name) else device_type
    for attr in ("cuda", "hip", "xpu"):
        value = getattr(torch.version, attr, None)
        if value:
            facts[f"{attr}_runtime"] = str(value)
    driver = getattr(module, "driver_version", None) or getattr(getattr(module, "_C", None), "_get_driver_version", None)
    if callable(driver):
        try:
            facts["driver"] = str(driver())
        except Exception:  # a vendor API without a driver query: leave it out
            pass
    return facts


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_record(device: Any, outcomes: dict[str, str], command: str) -> dict[str, Any]:
    """The record's fields (pure: the tests check it without a session)."""
    counts = {k: sum(1 for v in outcomes.values() if v == k) for k in ("passed", "failed", "skipped")}
    features: dict[str, str] = {}
    for feature, needles in FEATURES.items():
        hits = {node: v for node, v in outcomes.items() if any(n in node for n in needles) and v != "skipped"}
        if hits:
            passed = all(v == "passed" for v in hits.values())
            one_process = all(ONE_PROCESS_TEST in node for node in hits)
            features[feature] = ("passed (1 process)" if one_process else "passed") if passed else "failed"
    record: dict[str, Any] = {"date": datetime.date.today(), **_device_facts(device.type)}
    record.update(
        lightning=_version("lightning") or "", python=platform.python_version(), **counts,
        failed_tests=sorted(n for n, v in outcomes.items() if v == "failed"), features=features, command=command,
    )
    vendor = None
    from lightning_anyaccel.devices import DEVICE_TABLE

    spec = DEVICE_TABLE.get(device.type)
    if spec is not None and spec.vendor_module and not device.emulated:
        vendor = spec.vendor_module.split(".")[0]
        record["vendor_package"] = f"{vendor} {_version(vendor.replace('_', '-')) or _version(vendor) or '?'}"
    if device.emulated:
        record["note"] = "emulated accelerator (tests/emulator): host memory, CPU kernels, collectives over gloo"
    return record


def write_record(path: Path, device: Any, session: pytest.Session) -> None:
    """Write the record of this session to ``path`` (TOML); under pytest-xdist, only the controller writes."""
    if hasattr(session.config, "workerinput"):
        return
    command = "pytest " + " ".join(session.config.invocation_params.args)
    record = build_record(device, COLLECTOR.outcomes, command)
    level = "emulated" if device.emulated else "hardware"
    lines = [f"# validation record: paste into docs/validation.toml (see docs/validate_hardware.md)",
             f"[devices.{device.type}.{level}]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in record.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"\nvalidation record written to {path}", file=sys.stderr)
