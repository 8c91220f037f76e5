"""``--expected-skips`` (``tests/skip_check.py``): a run fails on a skip its list does not expect.

Each case runs pytest (no plugins but the check, a few tenths of a second) on a small test file in an empty
folder, with a list of expected skips, and reads its exit status and summary. The list of the project itself
is checked for what the check reads (every entry has a why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS
from skip_check import load

TESTS_FILE = '''
import pytest

def test_expected():
    pytest.skip("no frobnicator here (CI installs it)")

def test_unexpected():
    pytest.skip("something else is missing")

def test_runs():
    pass
'''

OUTSIDE_CI = '''
[[skip]]
tests = ["test_cases.py::test_expected"]
message = "no frobnicator here"
outside_ci = true
why = "CI installs the frobnicator"
'''
EXPECTED = OUTSIDE_CI + '''
[[skip]]
tests = ["test_cases.py::test_runs"]
message = "no longer skips"
devices = ["cpu"]
why = "an entry left behind"

[[skip]]
tests = ["test_cases.py::test_runs"]
message = "skips on another pass"
devices = ["emulated:*"]
why = "applies to the emulated passes only"
'''

CONFTEST = f'''
import sys
from pathlib import Path
sys.path.insert(0, {str(TESTS)!r})
from skip_check import SkipCheck

def pytest_configure(config):
    config.pluginmanager.register(SkipCheck(Path("expected.toml"), "cpu"), "skip-check")
'''


def _run(folder: Path, *, ci: bool, only: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "ANYACCEL_CI")}
    env.update(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **({"ANYACCEL_CI": "1"} if ci else {}))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_cases.py"]
    if only:
        args += ["-k", only]
    return subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "test_cases.py").write_text(TESTS_FILE)
    (tmp_path / "expected.toml").write_text(EXPECTED)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    return tmp_path


def test_unexpected_and_stale_entries_fail_the_run(folder: Path) -> None:
    proc = _run(folder, ci=False)
    assert proc.returncode == 1, proc.stdout
    assert "unexpected skip: test_cases.py::test_unexpected: something else is missing" in proc.stdout
    assert "expected skip no longer happens (test_cases.py::test_runs: 'no longer skips')" in proc.stdout
    assert "test_expected" not in proc.stdout.split("skips not in")[1]  # outside CI, the tool may be missing
    assert "another pass" not in proc.stdout  # an entry of other passes is not judged here


def test_outside_ci_entries_fail_in_ci_and_a_clean_run_passes(folder: Path) -> None:
    proc = _run(folder, ci=True, only="test_expected")
    assert proc.returncode == 1, proc.stdout
    assert "unexpected skip: test_cases.py::test_expected: no frobnicator here" in proc.stdout
    (folder / "expected.toml").write_text(OUTSIDE_CI)
    clean = _run(folder, ci=False, only="test_expected or test_runs")
    assert clean.returncode == 0, clean.stdout


def test_the_projects_list_gives_every_entry_a_why() -> None:
    entries = load(TESTS / "expected_skips.toml")
    assert entries and all(entry.why.strip() and entry.tests and all(entry.messages) for entry in entries)


def test_an_opt_in_entry_does_not_apply_while_its_variable_runs_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``opt_in = "VAR"``: the skip is expected until ``VAR=1`` asks for the run, which then must not skip."""
    from skip_check import ExpectedSkip

    entry = ExpectedSkip(tests=("t.py::test_x",), messages=("VAR=1 runs it",), why="a repeat", opt_in="VAR")
    monkeypatch.delenv("VAR", raising=False)
    assert entry.expects("t.py::test_x", "a repeat; VAR=1 runs it", "cpu", in_ci=True)
    monkeypatch.setenv("VAR", "1")
    assert not entry.applies_to("cpu") and not entry.expects("t.py::test_x", "VAR=1 runs it", "cpu", in_ci=True)
