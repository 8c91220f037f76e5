"""``pytest --validation-record PATH``: the run writes its validation record (docs/validate_hardware.md).

The record (format and checks: ``lightning_anyaccel.kit.tools.records``) holds every test's outcome and the
features each passing test proves. A test names those features with the marker
``@pytest.mark.feature("ddp", ..., processes=N)`` (``processes``: how many processes it trains with;
``1`` for a multi-process strategy run as one process). Credit goes to the device under test only
from tests that train on it: tests marked ``device_generic``, and, where the device under test is
CPU, every marked test (the others train on CPU). No test id is matched by its name.

A test that checks the package's decisions for a device type with torch's device API replaced by
fakes (``tests/test_simulated.py``) says so with ``@pytest.mark.simulates("xpu", "ddp", ...)``: the
device type and the features; ``--simulated-records DIR`` writes ``DIR/<type>-simulated.toml`` for
each simulated type, from those tests alone. Such a test is never credited to the device under test.

The commit comes from git in this checkout, or from ``LIGHTNING_ANYACCEL_COMMIT`` in a copy of the
tree without ``.git`` (``lightning_anyaccel.kit.tools.records.provenance``).

Parity: ``tests/test_parity.py`` appends each strategy's measured differences, where its test passed, to the
file ``ANYACCEL_PARITY_LOG`` names (one JSON line each); the collector points it at a file of this session
(or reads what the session appends to the one given) and writes them into the record's ``[parity]`` section.
``--parity-record PATH``: a parity-only run (``make records-parity``) replaces that section alone in the
existing record ``PATH``, with its own provenance; the rest of the record stays as its run wrote it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from lightning_anyaccel.kit.tools import records

ROOT = Path(__file__).resolve().parents[1]
#: What an emulated record proves and what it does not, written into it.
EMULATED_NOTE = ("the emulated accelerator (lightning_anyaccel.kit.emulator) under this device type's name: real tensors and"
                 " autocast on a PrivateUse1 (or torch's own xpu/hpu) device, host memory, CPU kernels,"
                 " collectives through the emulator's backend over gloo (not the vendor's collective library)")
#: The variable tests/test_parity.py appends its measured differences to (one JSON line per strategy that passed).
PARITY_LOG_ENV = "ANYACCEL_PARITY_LOG"
#: The test file of parity (its failures are listed in the record's ``[parity]`` section), and the processes of
#: its launch (``needs_devices(2)``: one 2-process launch per device under test).
PARITY_TESTS, PARITY_PROCESSES = "tests/test_parity.py::", 2
#: The code every pytest record covers besides the test files that ran (their commits age the record).
COMMON_COVERS = ("src", "examples", "tests/conftest.py", "tests/front_ends.py", "tests/scripts",
                 "tests/validation_record.py")


def _features(item: pytest.Item) -> tuple[tuple[str, ...], int | None]:
    """The features an item's ``feature`` markers name (nearest first), and the processes it trains with."""
    names: list[str] = []
    processes = None
    for marker in item.iter_markers("feature"):
        names += [n for n in marker.args if n not in names]
        processes = marker.kwargs.get("processes", processes)
    return records.check_features(names, item.nodeid), processes


def _simulated(item: pytest.Item) -> dict[str, list[str]]:
    """The device types an item's ``simulates`` markers name, each with its features."""
    found: dict[str, list[str]] = {}
    for marker in item.iter_markers("simulates"):
        device_type, *names = marker.args
        found.setdefault(device_type, [])
        found[device_type] += [n for n in records.check_features(names, item.nodeid) if n not in found[device_type]]
    return found


class Collector:
    """Collects the outcome of every test of the session (registered by tests/conftest.py).

    Each worker of pytest-xdist attaches the features of its items to their reports
    (``user_properties`` travel to the controlling process with the reports), so the controller,
    which collects nothing itself, writes one record for the whole run.
    """

    def __init__(self, device: Any) -> None:
        self.device = device
        self.outcomes: dict[str, records.Outcome] = {}
        #: simulated device type -> nodeid -> outcome (with that type's features)
        self.simulated: dict[str, dict[str, records.Outcome]] = {}
        # the parity log: pytest-xdist's workers, started after this, inherit the variable
        given = os.environ.get(PARITY_LOG_ENV)
        self.owns_log = given is None
        if given is None:
            handle, given = tempfile.mkstemp(prefix="anyaccel-parity-", suffix=".jsonl")
            os.close(handle)
            os.environ[PARITY_LOG_ENV] = given
        self.parity_log = Path(given)
        self.parity_offset = self.parity_log.stat().st_size if self.parity_log.exists() else 0

    def pytest_unconfigure(self) -> None:
        if self.owns_log:  # the session's own log, after the record was written
            self.parity_log.unlink(missing_ok=True)
            os.environ.pop(PARITY_LOG_ENV, None)

    def parity(self) -> dict[str, dict[str, float]]:
        """Per strategy, the differences the parity tests of this session measured on the device under test."""
        if not self.parity_log.exists():
            return {}
        with self.parity_log.open(encoding="utf-8") as log:
            log.seek(self.parity_offset)
            lines = [json.loads(line) for line in log.read().splitlines() if line.strip()]
        return {line["strategy"]: {k: line[k] for k in records.PARITY_KEYS}
                for line in lines if line.get("device") == self.device.type}

    def parity_failures(self) -> list[str]:
        """The parity tests of this session that failed (their strategies have no numbers)."""
        return sorted(n for n, t in self.outcomes.items() if n.startswith(PARITY_TESTS) and t.outcome == "failed")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            names, processes = _features(item)
            simulated = _simulated(item)
            if simulated:
                item.user_properties.append(("anyaccel_simulates", simulated))
            elif names and (item.get_closest_marker("device_generic") or self.device.is_cpu):
                item.user_properties.append(("anyaccel_features", [list(names), processes]))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not (report.when == "call" or not report.passed):  # the call, or a setup/teardown that did not pass
            return
        if report.nodeid in self.outcomes and self.outcomes[report.nodeid].outcome == "failed":
            return  # a failed call stays failed whatever its teardown did
        features, processes = dict(report.user_properties).get("anyaccel_features", [[], None])
        outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
        reason = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            reason = (report.longreprtext.strip().splitlines() or [""])[-1][:300]
        self.outcomes[report.nodeid] = records.Outcome(outcome, tuple(features), processes, reason)
        for device_type, names in dict(report.user_properties).get("anyaccel_simulates", {}).items():
            self.simulated.setdefault(device_type, {})[report.nodeid] = records.Outcome(outcome, tuple(names),
                                                                                         None, reason)


#: What a simulated record proves and what it does not, written into it.
SIMULATED_NOTE = ("torch's device API for this type replaced with fakes (tests/fakes.py) on a CPU build: the"
                  " package's decisions (devices, backend name, precision device, seeding, statistics, fork"
                  " refusal) checked; nothing ran on a device")


def _command(session: pytest.Session) -> str:
    return "pytest " + " ".join(a if " " not in a else repr(a) for a in session.config.invocation_params.args)


def _write(path: Path, record: dict[str, Any]) -> None:
    records.write(path, record)
    print(f"\nvalidation record written to {path}: {record['passed']} passed, {record['failed']} failed,"
          f" {record['skipped']} skipped; commit {record['commit'][:12]}"
          f"{'' if record['tree_clean'] else ' with uncommitted changes'}", file=sys.stderr)


def write_record(path: Path, device: Any, session: pytest.Session, collector: Collector) -> None:
    """Write the record of this session to ``path``; under pytest-xdist, only the controller writes."""
    if hasattr(session.config, "workerinput"):
        return
    files = sorted({nodeid.split("::", 1)[0] for nodeid in collector.outcomes})
    covers = [*COMMON_COVERS, *files, *(["src/lightning_anyaccel/kit/emulator"] if device.emulated else [])]
    record = records.build_record(device_type=device.type, level=device.level, tests=collector.outcomes,
                                  command=_command(session), covers=covers, root=ROOT, runner="pytest",
                                  note=EMULATED_NOTE if device.emulated else "")
    measured, failed = collector.parity(), collector.parity_failures()
    if measured or failed:
        record["parity"] = records.parity_section(measured, processes=PARITY_PROCESSES, command=record["command"],
                                                  root=ROOT, failed_tests=failed, date=record["date"])
    _write(path, record)


def check_parity_record(path: Path, device: Any) -> None:
    """Before a parity-only run: ``path`` must be this device's record as its run wrote it (else a UsageError)."""
    if not path.is_file():
        raise pytest.UsageError(f"--parity-record {path}: no such record; a parity-only run adds its section to an"
                                f" existing one: write it first (make records DEVICE_RECORDS={device.type})")
    try:
        records.with_parity(path.read_text(encoding="utf-8"), {}, device.type, device.level)
    except ValueError as err:
        raise pytest.UsageError(f"--parity-record {path}: {err}") from None


def write_parity_record(path: Path, device: Any, session: pytest.Session, collector: Collector) -> None:
    """Replace the ``[parity]`` section of the record ``path`` with this session's; the controller alone writes."""
    if hasattr(session.config, "workerinput"):
        return
    measured, failed = collector.parity(), collector.parity_failures()
    if not measured and not failed:
        print(f"\nno parity measured on {device.type} in this run (tests/test_parity.py did not run there):"
              f" {path} left as it was", file=sys.stderr)
        return
    section = records.parity_section(measured, processes=PARITY_PROCESSES, command=_command(session), root=ROOT,
                                     failed_tests=failed)
    records.write(path, records.with_parity(path.read_text(encoding="utf-8"), section, device.type, device.level))
    print(f"\nparity of {len(measured)} strategies written to {path}"
          f"{f', failed: {len(failed)}' if failed else ''}; commit {section['commit'][:12]}"
          f"{'' if section['tree_clean'] else ' with uncommitted changes'}", file=sys.stderr)


def write_simulated_records(folder: Path, session: pytest.Session, collector: Collector) -> None:
    """Write ``folder/<type>-simulated.toml`` for every device type a test of this session simulated."""
    if hasattr(session.config, "workerinput"):
        return
    for device_type, tests in sorted(collector.simulated.items()):
        files = sorted({nodeid.split("::", 1)[0] for nodeid in tests})
        facts = {"device_name": f"simulated {device_type} (fakes of torch's device API)", "device_count": 0}
        _write(folder / f"{device_type}-simulated.toml",
               records.build_record(device_type=device_type, level="simulated", tests=tests, command=_command(session),
                                    covers=[*COMMON_COVERS, "tests/fakes.py", *files], root=ROOT, runner="pytest",
                                    note=SIMULATED_NOTE, facts=facts))
