"""``pytest --device-pass=NAME``: which tests a pass of ``make`` runs on which device, from ``device_passes.toml``.

The Makefile names a pass; the pass (tests/device_passes.toml) says the device, the marker, the files, the
workloads and what it leaves out, each rule with its reason. :func:`apply` turns it into pytest's own
options before collection (``--device``, ``-m``, ``-k``, ``--deselect``), so the selection is pytest's:
``pytest --device-pass=xpu --collect-only -q`` lists it. Documented in docs/contributing.md.

A rule marked ``repeat = true`` leaves out tests whose code path another test of ``make test`` runs, and a
pass's ``repeat_workloads`` are workloads another pass trains: with ``ANYACCEL_RUN_REPEATS=1`` in the
environment the pass runs those too (docs/contributing.md, "Repeats").
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 environments (tomli is a pytest dependency there)
    import tomli as tomllib

TABLE = Path(__file__).resolve().parent / "device_passes.toml"
ROOT = TABLE.parents[1]
#: ``ANYACCEL_RUN_REPEATS=1``: run the repeats ``make test`` leaves out (rules marked ``repeat``, ``repeat_workloads``).
REPEATS = "ANYACCEL_RUN_REPEATS"


def run_repeats() -> bool:
    """Whether this run also runs the repeats (``ANYACCEL_RUN_REPEATS=1``)."""
    return os.environ.get(REPEATS) == "1"


def skip_repeat(runs_it: str) -> None:
    """Skip a test whose code path ``runs_it`` (other tests of ``make test``) runs, unless this run runs the repeats
    (docs/contributing.md, "Repeats"; its entry in tests/expected_skips.toml has ``opt_in``)."""
    if not run_repeats():
        pytest.skip(f"a repeat: its code path is run by {runs_it}; {REPEATS}=1 runs it")


@dataclass(frozen=True)
class LeaveOut:
    """A rule a pass leaves tests out by: a ``-k`` expression or node ids, and why."""

    name: str
    why: str
    keyword: str | None = None
    tests: tuple[str, ...] = ()
    #: the tests repeat a code path another test of ``make test`` runs (``why`` names it): run with ANYACCEL_RUN_REPEATS=1
    repeat: bool = False


@dataclass(frozen=True)
class DevicePass:
    """One pass of ``make``: its device, marker, files, workloads and the rules it leaves tests out by."""

    name: str
    why: str
    device: str | None = None
    marker: str | None = None
    files: tuple[str, ...] = ()
    workloads: tuple[str, ...] | None = None
    leave_out: tuple[LeaveOut, ...] = field(default=())
    #: workloads another pass trains, trained here too with ANYACCEL_RUN_REPEATS=1
    repeat_workloads: tuple[str, ...] = ()

    def with_repeats(self) -> DevicePass:
        """This pass as ``ANYACCEL_RUN_REPEATS=1`` runs it: without its ``repeat`` rules, with its repeated workloads."""
        workloads = None if self.workloads is None else (*self.workloads, *self.repeat_workloads)
        return replace(self, workloads=workloads, repeat_workloads=(),
                       leave_out=tuple(rule for rule in self.leave_out if not rule.repeat))

    @property
    def keyword(self) -> str | None:
        """The pass's ``-k`` expression: none of its keyword rules."""
        rules = [f"not ({rule.keyword})" for rule in self.leave_out if rule.keyword]
        return " and ".join(rules) or None

    @property
    def deselected(self) -> list[str]:
        return [test for rule in self.leave_out for test in rule.tests]


def load(path: Path = TABLE) -> dict[str, DevicePass]:
    """Every pass of the table, by name.

    Raises:
        pytest.UsageError: a pass names a rule the table does not have, or a rule has neither or both forms.
    """
    table = tomllib.loads(path.read_text())
    rules: dict[str, LeaveOut] = {}
    for name, rule in table.get("leave_out", {}).items():
        if ("keyword" in rule) == ("tests" in rule) or not rule.get("why"):
            raise pytest.UsageError(f"{path}: [leave_out.{name}] needs `why` and either `keyword` or `tests`")
        rules[name] = LeaveOut(name, rule["why"], rule.get("keyword"), tuple(rule.get("tests", ())),
                               bool(rule.get("repeat", False)))
    passes = {}
    for name, entry in table["pass"].items():
        unknown = [r for r in entry.get("leave_out", []) if r not in rules]
        if unknown:
            raise pytest.UsageError(f"{path}: [pass.{name}] leaves out by {unknown}, which [leave_out] does not define")
        workloads = entry.get("workloads")
        passes[name] = DevicePass(name, entry["why"], entry.get("device"), entry.get("marker"), tuple(entry.get("files", ())),
                                  None if workloads is None else tuple(workloads),
                                  tuple(rules[r] for r in entry.get("leave_out", [])),
                                  tuple(entry.get("repeat_workloads", ())))
    return passes


def _given(config: pytest.Config, option: str) -> bool:
    """Whether the command line itself gave ``option`` (``--device x`` or ``--device=x``)."""
    return any(arg == option or arg.startswith(option + "=") for arg in config.invocation_params.args)


def _and(existing: str | None, added: str | None) -> str | None:
    if not existing or not added:
        return existing or added
    return f"({existing}) and ({added})"


def apply(config: pytest.Config, name: str) -> DevicePass:
    """Set ``config``'s options to what pass ``name`` runs (before the device is set up and tests are collected).

    The command line's own ``--device``, ``-m`` and ``-k`` stay in force: ``-m``/``-k`` narrow the pass further.
    """
    passes = load()
    if name not in passes:
        raise pytest.UsageError(f"--device-pass={name}: not a pass of {TABLE.relative_to(ROOT)} ({', '.join(passes)})")
    chosen = passes[name].with_repeats() if run_repeats() else passes[name]
    if chosen.device and not _given(config, "--device"):
        config.option.device = chosen.device
    elif not chosen.device and not _given(config, "--device"):
        raise pytest.UsageError(f"--device-pass={name} runs on the device you name: add --device TYPE")
    if getattr(config.option, "device_pass_applied", None) == name:
        return chosen  # pytest-xdist's workers receive the options already set
    config.option.markexpr = _and(config.option.markexpr, chosen.marker) or ""
    config.option.keyword = _and(config.option.keyword, chosen.keyword) or ""
    config.option.deselect = [*(config.option.deselect or []), *chosen.deselected]
    config.option.device_pass_files = [ROOT / f for f in chosen.files]  # conftest.py's pytest_ignore_collect
    if chosen.workloads is not None:
        os.environ.setdefault("WORKLOAD_CONFIGS", ",".join(chosen.workloads))
    config.option.device_pass_applied = name
    return chosen

