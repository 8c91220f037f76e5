"""``--expected-skips FILE``: the run fails on a skip that the file does not expect (``make test`` passes it).

A skipped test proves nothing, and one that skips wherever CI runs it can never fail. So every skip of a
run is checked against a short list, ``tests/expected_skips.toml``, in which each entry says which tests
may skip (``tests``: node ids, ``*`` standing for any text and brackets for themselves: ``test_x[*]``),
with which message (``message``: a part of the skip's reason, or a list of such parts), in which passes
(``devices``: patterns of the ``--device`` value, every pass when absent), and why that is right
(``why``). An entry with ``outside_ci = true`` names something CI installs (Chromium, SLURM, root):
outside CI (neither ``ANYACCEL_CI``, which ``.ci/run`` sets, nor the usual ``CI`` set) the skip is
accepted, in CI it fails the run like any other. An entry with ``opt_in = "VAR"`` is a run CI leaves out that
``VAR=1`` turns on (``ANYACCEL_RUN_REPEATS``, ``ANYACCEL_FAULT_MATRIX_FULL``): while ``VAR=1`` is set the
entry does not apply, so the test must run.

At the end of the session (in the controlling process under pytest-xdist, which receives every
worker's reports) the run fails, listing them, when a skip matched no entry, or when an entry that
applies to this pass matched tests that ran and none of them skipped (the list must not keep what no
longer skips). Documented in docs/contributing.md ("Skips").
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 environments (tomli is a pytest dependency there)
    import tomli as tomllib


@dataclass(frozen=True)
class ExpectedSkip:
    """One entry of the expected-skips file."""

    tests: tuple[str, ...]
    messages: tuple[str, ...]
    why: str
    devices: tuple[str, ...] = ("*",)
    outside_ci: bool = False
    #: the environment variable that runs what this entry skips (``VAR=1``): the entry does not apply then
    opt_in: str | None = None

    def applies_to(self, device: str) -> bool:
        if self.opt_in is not None and os.environ.get(self.opt_in) == "1":
            return False
        return any(_matches(pattern, device) for pattern in self.devices)

    def covers(self, nodeid: str) -> bool:
        return any(_matches(pattern, nodeid) for pattern in self.tests)

    def matches(self, message: str) -> bool:
        return any(part in message for part in self.messages)

    def expects(self, nodeid: str, message: str, device: str, in_ci: bool) -> bool:
        return (self.applies_to(device) and self.covers(nodeid) and self.matches(message)
                and not (self.outside_ci and in_ci))


def _matches(pattern: str, text: str) -> bool:
    """``*`` matches any text; everything else, brackets of test parameters included, only itself.

    >>> _matches("tests/t.py::test_a[*]", "tests/t.py::test_a[x-1]"), _matches("emulated:*", "cpu")
    (True, False)
    """
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), text) is not None


def load(path: Path) -> list[ExpectedSkip]:
    """The entries of ``path``; a malformed entry is a usage error naming it."""
    entries = []
    for number, raw in enumerate(tomllib.loads(path.read_text())["skip"], start=1):
        unknown = set(raw) - {"tests", "message", "why", "devices", "outside_ci", "opt_in"}
        missing = {"tests", "message", "why"} - set(raw)
        if unknown or missing or not raw.get("why", "").strip():
            raise pytest.UsageError(f"{path}, entry {number}: needs tests, message and a why"
                                    f" (unknown keys: {sorted(unknown)}, missing: {sorted(missing)})")
        message = raw["message"]
        entries.append(ExpectedSkip(tests=tuple(raw["tests"]), why=raw["why"],
                                    messages=(message,) if isinstance(message, str) else tuple(message),
                                    devices=tuple(raw.get("devices", ["*"])),
                                    outside_ci=bool(raw.get("outside_ci", False)), opt_in=raw.get("opt_in")))
    return entries


def skip_message(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason of a skip report (pytest stores ``(path, line, "Skipped: reason")``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipCheck:
    """Collects the skips and the tests that ran; judges them at the end (registered by ``tests/conftest.py``)."""

    def __init__(self, path: Path, device: str) -> None:
        self.path = path
        self.device = device
        self.entries = load(path)
        self.in_ci = bool(os.environ.get("ANYACCEL_CI") or os.environ.get("CI"))
        self.skipped: dict[str, str] = {}
        self.ran: set[str] = set()
        self.problems: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(report, "wasxfail"):
            return
        if report.skipped:
            self.skipped[report.nodeid] = skip_message(report)
        elif report.when == "call":
            self.ran.add(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:  # a module skipped as a whole (pytest.importorskip at its top)
            self.skipped[report.nodeid] = skip_message(report)

    def judge(self) -> list[str]:
        """What fails the run: skips no entry expects, entries of this pass that no longer skip."""
        problems = []
        for nodeid, message in sorted(self.skipped.items()):
            if not any(entry.expects(nodeid, message, self.device, self.in_ci) for entry in self.entries):
                problems.append(f"unexpected skip: {nodeid}: {message}")
        for entry in self.entries:
            if entry.outside_ci or not entry.applies_to(self.device):
                continue
            ran = [n for n in self.ran if entry.covers(n)]
            if ran and not any(entry.covers(n) and entry.matches(m) for n, m in self.skipped.items()):
                problems.append(f"expected skip no longer happens ({', '.join(entry.tests)}: {entry.messages[0]!r}):"
                                f" {ran[0]} ran; remove the entry from {self.path.name}")
        return problems

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(session.config, "workerinput"):  # an xdist worker: the controller judges
            return
        self.problems = self.judge()
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.problems:
            return
        terminalreporter.section(f"skips not in {self.path} (--device {self.device}"
                                 f"{', CI' if self.in_ci else ''})", red=True)
        for problem in self.problems:
            terminalreporter.line(problem, red=True)
        terminalreporter.line(f"A skip proves nothing: fix the test, or add an entry with a why to {self.path}"
                              " (docs/contributing.md, \"Skips\").")
