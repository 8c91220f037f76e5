"""CPython gh-112275 (a forked child deadlocks in its start): reproduced, bounded, and warned about.

The stress loop (``tests/scripts/fork_stress.py``) forks while other threads enter and leave
Python. With native threads calling back into Python, an affected CPython (3.8-3.11 before
3.11.10; see :mod:`lightning_anyaccel.cluster.fork_deadlock`) leaves some children hung in
``PyOS_AfterFork_Child``; each is bounded (killed after 1 s) and counted, and the count is printed.
Python-level threads starting and ending (what the package's and Lightning's threads are) hang
none: they take the runtime's head lock only with the GIL, which the forking thread holds.
On an unaffected Python both counts are 0 and the test shows the bound only.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
from torch.utils.data import DataLoader

from _cluster import PYTHON, ROOT
from lightning_anyaccel.cluster import fork_deadlock

STRESS = ROOT / "tests" / "scripts" / "fork_stress.py"
FORKS = 800


def stress(mode: str) -> dict:
    proc = subprocess.run([PYTHON, str(STRESS), str(FORKS), mode], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks and /proc: Linux")
def test_forks_while_threads_enter_python_are_bounded_and_python_threads_hang_none() -> None:
    native, python = stress("native"), stress("python")
    print(f"gh-112275 stress on Python {native['python']} (affected: {fork_deadlock.affected()}):"
          f" {native['hung']} of {FORKS} children hung with native threads entering Python,"
          f" {python['hung']} of {FORKS} with Python threads starting and ending")
    assert not native["left"] and not python["left"], "a hung child outlived its bound"
    assert python["hung"] == 0, python
    if not fork_deadlock.affected():
        assert native["hung"] == 0, f"this Python is listed as fixed, yet children hung: {native}"


def test_the_warning_names_the_issue_and_the_fix_once(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(fork_deadlock, "_warned", False)
    monkeypatch.setattr(fork_deadlock, "affected", lambda version=None: True)
    monkeypatch.setattr(fork_deadlock, "FIXED_IN", {sys.version_info[:2]: (3, 11, 10)})
    data = list(range(8))
    assert not fork_deadlock.warn_if_affected(DataLoader(data, num_workers=0))
    assert not fork_deadlock.warn_if_affected(DataLoader(data, num_workers=1, multiprocessing_context="forkserver"))
    with caplog.at_level(logging.WARNING):
        assert fork_deadlock.warn_if_affected(DataLoader(data, num_workers=1, multiprocessing_context="fork"))
        assert not fork_deadlock.warn_if_affected(DataLoader(data, num_workers=1, multiprocessing_context="fork"))
    assert "gh-112275" in caplog.text and "3.11.10" in caplog.text and "forkserver" in caplog.text


def test_affected_releases() -> None:
    assert fork_deadlock.affected((3, 11, 7)) and fork_deadlock.affected((3, 10, 14))
    assert not any(fork_deadlock.affected(v) for v in [(3, 11, 10), (3, 10, 15), (3, 12, 0), (3, 13, 1)])


def _affected_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a script (its main module a file, as a training script's is; a pytest-xdist worker's is
    not) on a Python with gh-112275 (the tests' Python may have the fix)."""
    monkeypatch.setattr(sys.modules["__main__"], "__file__", __file__, raising=False)
    monkeypatch.setattr(fork_deadlock, "_warned", False)
    monkeypatch.setattr(fork_deadlock, "_switched", False)
    monkeypatch.setattr(fork_deadlock, "affected", lambda version=None: True)
    monkeypatch.setattr(fork_deadlock, "FIXED_IN", {sys.version_info[:2]: (3, 11, 10)})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's default start method")
def test_workers_that_pickle_start_by_forkserver_said_once(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The dataset and collate function pickle: the workers start by forkserver (and deliver every batch); the
    switch is logged once."""
    _affected_python(monkeypatch)
    loaders = [DataLoader(list(range(8)), batch_size=4, num_workers=1) for _ in range(2)]
    with caplog.at_level(logging.WARNING):
        assert all(fork_deadlock.avoid_fork(loader) for loader in loaders)
    assert [loader.multiprocessing_context.get_start_method() for loader in loaders] == ["forkserver"] * 2
    assert caplog.text.count("multiprocessing_context='forkserver' instead of 'fork'") == 1
    assert "gh-112275" in caplog.text and "keep 'fork'" not in caplog.text
    assert [batch.tolist() for batch in loaders[0]] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_workers_that_do_not_pickle_keep_fork_with_the_warning(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A lambda as collate function does not pickle: the workers keep fork, and the warning says why."""
    _affected_python(monkeypatch)
    loader = DataLoader(list(range(8)), num_workers=1, collate_fn=lambda batch: batch, multiprocessing_context="fork")
    with caplog.at_level(logging.WARNING):
        assert not fork_deadlock.avoid_fork(loader)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert "The workers keep 'fork': its collate_fn does not pickle" in caplog.text and "instead of" not in caplog.text
    assert not fork_deadlock.avoid_fork(DataLoader(list(range(8)), num_workers=0))  # no workers: nothing to start
