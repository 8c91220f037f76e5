"""tests/device_passes.toml, the passes ``make`` runs: every name in it resolves (fast, no collection).

``pytest --deselect`` and ``-k`` ignore what matches nothing, so a renamed test or file would silently join a
pass it was left out of: each node id, file and rule of the table must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import device_passes

ROOT = Path(__file__).resolve().parents[1]


def _missing(node_id: str) -> str | None:
    """Why ``node_id`` (``path::function[params]``) names no test, or ``None``."""
    path, _, rest = node_id.partition("::")
    function = re.split(r"[\[:]", rest, maxsplit=1)[0]
    if not (ROOT / path).is_file():
        return f"{path} does not exist"
    if not re.search(rf"^(?:async )?def {re.escape(function)}\(", (ROOT / path).read_text(), re.M):
        return f"{path} defines no {function}"
    return None


def test_every_node_id_and_file_of_the_table_exists() -> None:
    passes = device_passes.load()
    problems = {test: why for p in passes.values() for test in p.deselected if (why := _missing(test))}
    problems |= {f: "no such file" for p in passes.values() for f in p.files if not (ROOT / f).is_file()}
    assert problems == {}


def test_every_pass_says_why_and_every_rule_is_used() -> None:
    passes = device_passes.load()
    assert all(p.why for p in passes.values())
    used = {rule.name for p in passes.values() for rule in p.leave_out}
    defined = set(device_passes.tomllib.loads(device_passes.TABLE.read_text())["leave_out"])
    assert defined - used == set(), "rules no pass uses"


def test_a_wrong_table_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "passes.toml"
    table.write_text('[pass.x]\nwhy = "x"\nleave_out = ["nothing"]\n')
    with pytest.raises(pytest.UsageError, match="leaves out by .'nothing'., which .leave_out. does not define"):
        device_passes.load(table)
    table.write_text('[pass.x]\nwhy = "x"\n[leave_out.y]\nwhy = "y"\n')
    with pytest.raises(pytest.UsageError, match="needs `why` and either `keyword` or `tests`"):
        device_passes.load(table)
    assert _missing("tests/test_layers.py::test_no_such_test[x]") == "tests/test_layers.py defines no test_no_such_test"


def test_the_seed_devices_leave_out_the_launcher_tests_by_keyword() -> None:
    """The -k expression a pass runs is its keyword rules, each negated (pytest's own -k then selects)."""
    xpu = device_passes.load()["xpu"]
    assert xpu.keyword is not None and xpu.keyword.startswith("not (spawn or ddp_fork) and not (notebook)")
    assert xpu.deselected == ["tests/test_trainer_cpu.py::test_checkpoint_from_two_processes_resumes_on_one[trainer]"]


def test_the_repeats_run_with_anyaccel_run_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule marked ``repeat`` says which other test runs the code path (its why); ``ANYACCEL_RUN_REPEATS=1``
    drops those rules and adds the pass's ``repeat_workloads``, the rest of the pass unchanged."""
    passes = device_passes.load()
    repeats = [rule for p in passes.values() for rule in p.leave_out if rule.repeat]
    assert repeats and all("runs" in rule.why for rule in repeats)
    cpu = passes["cpu"]
    assert cpu.workloads == () and cpu.repeat_workloads == ("gpt2_single", "gpt2_deepspeed")
    full = cpu.with_repeats()
    assert full.workloads == ("gpt2_single", "gpt2_deepspeed") and not [r for r in full.leave_out if r.repeat]
    assert [r for r in full.leave_out if not r.repeat] == [r for r in cpu.leave_out if not r.repeat]
    monkeypatch.setenv(device_passes.REPEATS, "1")
    assert device_passes.run_repeats()
    monkeypatch.setenv(device_passes.REPEATS, "0")
    assert not device_passes.run_repeats()


ONE_TEST = "tests/test_workloads.py::test_compiled_causal_attention_matches_eager_on_the_device[eager]"


@pytest.mark.slow
def test_an_emulated_seed_device_runs_in_one_process(python_runner) -> None:
    """``--device emulated:xpu`` without xdist workers (``-p no:xdist``, ``make test DEVICE_TEST_WORKERS=0``): the
    pytest command starts again once with the device loaded at interpreter start, and a backward on it runs; where
    it can not start again (``pytest.main()`` in a program), a usage error names the fix."""
    env = {"ANYACCEL_EXPECTED_SKIPS": ""}
    proc = python_runner(["-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "--device",
                          "emulated:xpu", ONE_TEST], cwd=ROOT, timeout=240, env=env)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]
    code = ("import sys, pytest; sys.exit(pytest.main(['-p', 'no:xdist', '-p', 'no:cacheprovider', '-q',"
            f" '--device', 'emulated:xpu', {ONE_TEST!r}]))")
    proc = python_runner(["-c", code], cwd=ROOT, timeout=240, env=env)
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout[-3000:]
    assert "not the emulated 'xpu'" in proc.stdout and "-n 1 or more" in proc.stdout, proc.stdout[-3000:]
