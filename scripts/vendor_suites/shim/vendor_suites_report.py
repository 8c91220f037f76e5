"""pytest plugin (``-p vendor_suites_report``): each test's outcome and failure message, one JSON line each.

Written to the file named by ``VENDOR_SUITES_REPORT`` as each test ends; the runner
(scripts/vendor_suites/run.py) reads it back.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr or "")


def _write(entry: dict[str, Any]) -> None:
    with open(os.environ["VENDOR_SUITES_REPORT"], "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """One line per test: the call's outcome, or the setup's/teardown's where that failed or skipped."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call" or (report.when == "setup" and not report.passed) or (
            report.when == "teardown" and report.failed):
        if xfail:
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.failed and report.when != "call":
            outcome = "error"
        else:
            outcome = report.outcome
        _write({"test": report.nodeid, "outcome": outcome, "message": _message(report)[:600]})


def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A file that fails to import counts as one error."""
    if report.failed:
        _write({"test": report.nodeid, "outcome": "error", "message": _message(report)[-600:]})
