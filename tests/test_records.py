"""Validation records (``lightning_anyaccel.kit.tools.records``): written by the run, tied to the commit, checked.

A real pytest run writes one (``--validation-record``, under pytest-xdist as ``make test`` runs it);
every committed record in ``docs/records`` is what a run wrote (its digest, counts and features
follow from its own test list) and names a commit of this repository's history.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_python
from lightning_anyaccel.kit.tools import records

COMMITTED = sorted((ROOT / records.RECORD_DIR).glob("*.toml"))
FIT = "tests/test_trainer_cpu.py::test_single_device_fit_learns"
SKIPPED = "tests/test_trainer_cpu.py::test_fork_refused_after_the_parent_initialised_the_device"
UNMARKED = "tests/test_trainer_cpu.py::test_names_register"
SIMULATED = "tests/test_simulated.py::test_fork_refused_after_device_init[trainer]"


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def _has_history() -> bool:
    try:
        return bool(_git("rev-parse", "HEAD"))
    except (OSError, subprocess.CalledProcessError):
        return False


@pytest.mark.slow
def test_a_pytest_run_writes_its_record(tmp_path):
    """Two xdist workers: outcomes, skip reasons and marker-given features reach the record; unmarked tests
    credit nothing; a simulated test credits its simulated type only; the commit is the one given where git
    is not asked."""
    path = tmp_path / "cpu-hardware.toml"
    proc = run_python(["-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "-q", f"{FIT}[any-name]",
                       f"{FIT}[typed-any_single]", SKIPPED, UNMARKED, SIMULATED, "--validation-record", str(path),
                       "--simulated-records", str(tmp_path)],
                      env={records.COMMIT_ENV: "0123456789abcdef0123456789abcdef01234567-dirty"}, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    simulated = records.loads((tmp_path / "xpu-simulated.toml").read_text())
    assert (simulated["level"], simulated["features"], simulated["passed"]) == ("simulated", {"fork_safety": "passed"}, 1)
    assert sorted(p.name for p in tmp_path.glob("*.toml")) == ["cpu-hardware.toml", "xpu-simulated.toml"]
    text = path.read_text()
    assert records.problems(text) == []
    record = records.loads(text)
    assert (record["device_type"], record["level"], record["runner"]) == ("cpu", "hardware", "pytest")
    assert (record["commit"], record["tree_clean"]) == ("0123456789abcdef0123456789abcdef01234567", False)
    assert record["commit_source"] == records.COMMIT_ENV
    assert (record["passed"], record["failed"], record["skipped"]) == (4, 0, 1)
    assert record["features"] == {"single_device": "passed"}  # fork_safety: skipped here, simulated there
    assert record["tests"][SIMULATED] == {"outcome": "passed"}
    assert record["tests"][f"{FIT}[any-name]"] == {"outcome": "passed", "features": ["single_device"]}
    assert record["tests"][UNMARKED] == {"outcome": "passed"}
    skipped = record["tests"][SKIPPED]
    assert skipped["outcome"] == "skipped" and skipped["features"] == ["fork_safety"] and "fork" in skipped["reason"]
    assert "tests/test_trainer_cpu.py" in record["covers"] and "src" in record["covers"]
    assert record["command"].startswith("pytest ") and "--validation-record" in record["command"]
    assert record["torch"] and record["lightning"] and record["python"] and record["date"]


def _outcomes() -> dict[str, records.Outcome]:
    return {
        "t.py::ddp2": records.Outcome("passed", ("ddp",), 2),
        "t.py::ddp1": records.Outcome("passed", ("ddp",), 1),
        "t.py::fsdp1": records.Outcome("passed", ("fsdp",), 1),
        "t.py::fsdp2": records.Outcome("failed", ("fsdp2",), 2, "AssertionError: held"),
        "t.py::fork": records.Outcome("skipped", ("fork_safety",), reason="needs 2 cpu devices"),
        "t.py::plain": records.Outcome("passed"),
    }


def test_features_come_from_passing_marked_tests_only():
    summary = records.summarise(_outcomes())
    assert summary["features"] == {"ddp": "passed", "fsdp": "passed (1 process)", "fsdp2": "failed"}
    assert (summary["passed"], summary["failed"], summary["skipped"], summary["max_processes"]) == (4, 1, 1, 2)
    assert summary["failed_tests"] == ["t.py::fsdp2"]
    with pytest.raises(ValueError, match="unknown feature.*'forking'.*fork_safety"):
        records.check_features(["forking"], "t.py::x")


def _record_text(tmp_path: Path) -> str:
    record = records.build_record(device_type="cpu", level="hardware", tests=_outcomes(), command="pytest t.py",
                                  covers=["src", "t.py"], root=ROOT, runner="pytest")
    path = tmp_path / "r.toml"
    records.write(path, record)
    assert [p.name for p in tmp_path.iterdir()] == ["r.toml"]  # nothing staged left beside it
    return path.read_text()


def test_a_record_edited_by_hand_is_caught(tmp_path):
    text = _record_text(tmp_path)
    assert records.problems(text) == []
    # a count changed with the digest: caught by the digest
    assert "edited after the run" in records.problems(text.replace("passed = 4", "passed = 5"))[0]
    # ... and with a digest recomputed: the counts no longer follow from the tests
    body = text.split("\n", 3)[3].replace("\npassed = 4\n", "\npassed = 5\n")
    forged = records.dumps({**records.loads(body), "passed": 5})
    assert any("passed = 5, but its tests give 4" in p for p in records.problems(forged))
    # a feature added by hand
    forged = records.dumps({**records.loads(text), "features": {"ddp": "passed", "deepspeed": "passed"}})
    assert any(p.startswith("features = ") for p in records.problems(forged))


def test_an_interrupted_write_leaves_no_record(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(records.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        records.write(tmp_path / "r.toml", {"format": 1, "features": {}, "tests": {}})
    assert list(tmp_path.iterdir()) == []


def test_the_commit_without_git(tmp_path, monkeypatch):
    """A copy of the tree without ``.git``: the commit from the environment, else "unknown", never an error."""
    monkeypatch.delenv(records.COMMIT_ENV, raising=False)
    monkeypatch.setattr(records, "_installed_commit", lambda: None)
    assert records.provenance(tmp_path) == {"commit": "unknown", "tree_clean": False, "commit_source": "unknown"}
    monkeypatch.setenv(records.COMMIT_ENV, "abc1234")
    assert records.provenance(tmp_path) == {"commit": "abc1234", "tree_clean": True,
                                            "commit_source": records.COMMIT_ENV}
    monkeypatch.setenv(records.COMMIT_ENV, "main")
    with pytest.raises(ValueError, match="git rev-parse HEAD"):
        records.provenance(tmp_path)
    assert records.age({"commit": "unknown"}, ROOT) is None
    assert records.age({"commit": "0" * 40}, ROOT) is None  # not in this history (a shallow clone)
    assert records.age({"commit": "0" * 40}, tmp_path) is None  # no git at all


@pytest.mark.skipif(not _has_history(), reason="a copy without git history: the age is unknown there")
def test_age_counts_commits_to_the_covered_code():
    head = _git("rev-parse", "HEAD")
    first_src = _git("log", "--format=%H", "--", "src").splitlines()[-1]
    assert records.age({"commit": head, "covers": ["src"]}, ROOT) == 0
    expected = int(_git("rev-list", "--count", f"{first_src}..HEAD", "--", "src"))
    assert expected > 0 and records.age({"commit": first_src, "covers": ["src"]}, ROOT) == expected


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_records_are_what_their_runs_wrote(path):
    """Each committed record: the digest, counts and features follow from its own tests; its name says its
    device and level; its commit is in this repository's history (where the history is there to ask)."""
    text = path.read_text()
    assert records.problems(text) == [], path.name
    record = records.loads(text)
    # <type>-<level>, or <type>-<level>-kit for the validation kit's run beside the test suite's
    assert path.stem in {f"{record['device_type']}-{record['level']}{suffix}" for suffix in ("", "-kit")}, path.name
    assert (path.stem.endswith("-kit")) == (record["runner"] == "lightning_anyaccel.validate"), path.name
    # the record's commit, and that of the parity-only run that wrote its [parity] section, if one did
    for commit in [record["commit"], *([record["parity"]["commit"]] if "parity" in record else [])]:
        assert re.fullmatch(r"[0-9a-f]{40}", commit), f"{path.name}: no commit"
        if _has_history():
            assert subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, "HEAD"],
                                  capture_output=True).returncode == 0, f"{path.name}: {commit} is not in HEAD's history"


def test_records_exist():
    assert COMMITTED, f"no records in {records.RECORD_DIR}"


def _docs_extension():
    """docs/_ext/records_text.py as Sphinx loads it: with docs/_ext on the path (it imports device_pages)."""
    import importlib.util

    if str(ROOT / "docs" / "_ext") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    spec = importlib.util.spec_from_file_location("records_text", ROOT / "docs" / "_ext" / "records_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_matrix_reads_records_their_age_and_staleness(tmp_path, monkeypatch):
    """Levels and status from records only; a checkout without git history says "age unknown"; past the bound,
    "stale"; a feature that failed or ran as one process says so."""
    docs = _docs_extension()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "validation.toml").write_text((ROOT / "docs" / "validation.toml").read_text())
    monkeypatch.setenv(records.COMMIT_ENV, _git("rev-parse", "HEAD") if _has_history() else "0" * 40)
    record = records.build_record(device_type="cpu", level="emulated", tests=_outcomes(), command="pytest t.py",
                                  covers=["src"], root=None, runner="pytest")
    record["device_type"] = "sdaa"  # an emulated sdaa's record, without loading the emulator here
    records.write(tmp_path / records.RECORD_DIR / "sdaa-emulated.toml", record)
    entry = docs.load_validation(tmp_path)["devices"]["sdaa"]
    assert entry["status"] == "emulated" and entry["emulated"]["device_type"] == "sdaa"
    assert "age unknown" in docs.age_text(entry["emulated"])  # no .git in tmp_path: a shallow copy, say so
    assert docs.feature_cell(entry, "ddp") == "E"
    assert docs.feature_cell(entry, "fsdp") == "E (1 process)"
    assert docs.feature_cell(entry, "fsdp2") == "E failed"
    assert docs.feature_cell(entry, "fork_safety") == "-"  # skipped: no credit
    assert "pytest t.py" in docs.level_text(entry, "emulated")
    entry["emulated"]["_age"] = records.STALE_AFTER + 1
    assert "stale" in docs.age_text(entry["emulated"]) and docs.feature_cell(entry, "ddp") == "E stale"
    assert docs.load_validation(tmp_path)["devices"]["musa"]["status"] == "untested"  # no record at any level


def test_every_status_comes_from_a_record():
    docs = _docs_extension()
    data = docs.load_validation(ROOT)
    for device_type, entry in data["devices"].items():
        assert entry["status"] == next((lv for lv in docs.LEVELS if isinstance(entry.get(lv), dict)), "untested")
        for level in docs.LEVELS:
            if level in entry:
                assert entry[level]["_path"] == f"docs/records/{device_type}-{level}.toml"
            for more in entry.get("more", {}).get(level, []):  # a second run at the level: the kit's
                assert more["_path"] == f"docs/records/{device_type}-{level}-kit.toml"


def test_a_feature_cell_takes_the_strongest_result_of_a_levels_records():
    """The kit's record beside the suite's: a feature the suite skipped (2 devices) and the kit passed shows the pass."""
    docs = _docs_extension()
    suite = {"features": {"ddp": "passed (1 process)"}, "_age": 0}
    kit = {"features": {"ddp": "failed", "checkpoint": "passed"}, "_age": 0}
    entry = {"hardware": suite, "more": {"hardware": [kit]}}
    assert docs.feature_cell(entry, "checkpoint") == "H"
    assert docs.feature_cell(entry, "ddp") == "H (1 process)"
    assert docs.feature_cell({"hardware": suite}, "checkpoint") == "-"


NUMBERS = {"steps": 3, "norm": 2.5e-08, "grad": 3.2e-07, "update": 1.5e-07, "rtol": 1e-05, "atol": 1e-06}


def test_a_parity_only_run_replaces_the_parity_section_alone(tmp_path, monkeypatch):
    """``make records-parity``: the section of a younger run (its own commit and command) goes into the record the
    suite wrote, whose tests, counts and provenance stay; a record edited by hand, another device's record, a
    difference above its tolerance or a missing key are refused, naming why."""
    text = _record_text(tmp_path)
    monkeypatch.setenv(records.COMMIT_ENV, "89abcdef0123456789abcdef0123456789abcdef-dirty")
    section = records.parity_section({"ddp": NUMBERS, "fsdp2": {**NUMBERS, "grad": 4e-07}}, processes=2,
                                     command="pytest tests/test_parity.py", root=None,
                                     failed_tests=["tests/test_parity.py::x[fsdp]"])
    merged = records.dumps(records.with_parity(text, section, "cpu", "hardware"))
    assert records.problems(merged) == []
    before, after = records.loads(text), records.loads(merged)
    assert {k: v for k, v in after.items() if k != "parity"} == {k: v for k, v in before.items() if k != "digest"} | {
        "digest": after["digest"]}
    parity = after["parity"]
    assert (parity["commit"], parity["tree_clean"], parity["command"]) == ("89abcdef0123456789abcdef0123456789abcdef",
                                                                          False, "pytest tests/test_parity.py")
    assert after["commit"] == before["commit"] != parity["commit"]  # each part names the run that wrote it
    assert parity["strategies"]["fsdp2"] == {**NUMBERS, "grad": 4e-07} and parity["processes"] == 2
    assert parity["failed_tests"] == ["tests/test_parity.py::x[fsdp]"] and parity["torch"] and parity["date"]
    assert records.largest_difference(parity["strategies"]["fsdp2"]) == 4e-07
    with pytest.raises(ValueError, match="edited after the run.*make records"):
        records.with_parity(text.replace("passed = 4", "passed = 5"), section, "cpu", "hardware")
    with pytest.raises(ValueError, match="cpu-hardware, this run measured xpu-emulated.*xpu-emulated.toml"):
        records.with_parity(text, section, "xpu", "emulated")
    beyond = records.dumps({**after, "parity": {**parity, "strategies": {"ddp": {**NUMBERS, "grad": 2e-05}}}})
    assert records.problems(beyond) == ["parity of ddp: a difference above its tolerance rtol 1e-05"]
    with pytest.raises(ValueError, match="the keys are"):
        records.parity_section({"ddp": {"grad": 1e-07}}, processes=2, command="c", root=None)
    partial = records.dumps({**after, "parity": {k: v for k, v in parity.items() if k != "commit"}})
    assert records.problems(partial) == ["parity has no commit"]


def test_the_collector_takes_the_parity_this_session_measured_on_the_device_under_test(tmp_path, monkeypatch):
    """What tests/test_parity.py appends to ``ANYACCEL_PARITY_LOG``: lines written before the session and lines of
    another device are not this run's; a failed parity test is listed; a parity-only run needs the device's record."""
    from types import SimpleNamespace

    from validation_record import PARITY_LOG_ENV, Collector, check_parity_record

    log = tmp_path / "measured.jsonl"
    log.write_text(json.dumps({"device": "cpu", "strategy": "fsdp", **NUMBERS}) + "\n")  # an earlier session's
    monkeypatch.setenv(PARITY_LOG_ENV, str(log))
    device = SimpleNamespace(type="cpu", level="hardware", is_cpu=True, emulated=False)
    collector = Collector(device)
    with log.open("a") as out:
        out.write(json.dumps({"device": "cpu", "strategy": "ddp", **NUMBERS}) + "\n")
        out.write(json.dumps({"device": "xpu", "strategy": "fsdp2", **NUMBERS}) + "\n")
    assert collector.parity() == {"ddp": NUMBERS}
    collector.outcomes = {"tests/test_parity.py::t[fsdp]": records.Outcome("failed"),
                          "tests/test_parity.py::t[ddp]": records.Outcome("passed"),
                          "tests/test_x.py::t": records.Outcome("failed")}
    assert collector.parity_failures() == ["tests/test_parity.py::t[fsdp]"]
    collector.pytest_unconfigure()
    assert log.exists(), "a log the user named is theirs"
    with pytest.raises(pytest.UsageError, match="no such record.*make records DEVICE_RECORDS=cpu"):
        check_parity_record(tmp_path / "cpu-hardware.toml", device)
    (tmp_path / "r.toml").write_text(_record_text(tmp_path / "made"))
    check_parity_record(tmp_path / "r.toml", device)
    with pytest.raises(pytest.UsageError, match="this run measured xpu-emulated"):
        check_parity_record(tmp_path / "r.toml", SimpleNamespace(type="xpu", level="emulated"))


def test_the_grid_and_the_device_pages_show_the_largest_difference_from_one_device():
    """Per device type, per strategy the measurement of the strongest level (the largest of its records), rounded up
    in the grid over the fp32 strategies; the kit's bf16 GPT-2 is listed with its own tolerance, not in the grid."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("device_pages", ROOT / "docs" / "_ext" / "device_pages.py")
    pages = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pages)
    assert [pages.upper_bound(v) for v in (3.2e-07, 3e-07, 9.5e-08, 1e-05, 0.0)] == ["4e-7", "3e-7", "1e-7", "1e-5", "0"]
    suite = {"parity": {"processes": 2, "date": "2026-11-28", "strategies": {"ddp": NUMBERS,
                                                                           "fsdp2": {**NUMBERS, "update": 6e-07}}}}
    kit = {"date": "2026-11-29", "tests": {
        "validate::ddp": {"outcome": "passed", "processes": 2, "parity": {**NUMBERS, "grad": 9e-07}},
        "validate::transformer": {"outcome": "passed", "processes": 4,
                                  "parity": {**NUMBERS, "grad": 6e-03, "rtol": 2e-02, "atol": 0.0}},
        "validate::fsdp": {"outcome": "failed"}}}
    emulated = {"parity": {"processes": 2, "date": "2026-11-27", "strategies": {"deepspeed_3": {**NUMBERS, "grad": 8e-06}}}}
    entry = {"hardware": suite, "more": {"hardware": [kit]}, "emulated": emulated}
    runs = {run["name"]: run for run in pages.parity_runs(entry)}
    assert list(runs) == ["ddp", "fsdp2", "deepspeed_3", "transformer"]
    assert runs["ddp"]["largest"] == 9e-07 and runs["ddp"]["processes"] == 2  # the larger of the level's two
    assert (runs["deepspeed_3"]["level"], runs["transformer"]["processes"]) == ("emulated", 4)
    with_backend = SimpleNamespace(backend="gloo", name="a device", type="x")
    without = SimpleNamespace(backend=None, name="a device", type="x")
    assert pages.parity_mark(with_backend, entry) == "H ≤9e-7"  # the bf16 GPT-2 (6e-3) is not an fp32 figure
    assert pages.parity_mark(with_backend, {"emulated": emulated}) == "E ≤8e-6"
    assert pages.parity_mark(with_backend, {}) == "–" and pages.parity_mark(without, entry) == "✗"
    table = "\n".join(pages._parity_lines(with_backend, entry))
    assert "| DDP | 2 | 9e-7 | rtol 1e-5, atol 1e-6 | run on hardware | 2026-11-29 |" in table, table
    assert "| FSDP2 | 2 | 6e-7 | rtol 1e-5, atol 1e-6 | run on hardware |" in table, table
    assert "| GPT-2 with DDP, bf16-mixed | 4 | 6e-3 | 2e-2 per tensor (bf16) | run on hardware |" in table, table
    assert [pages._sci(v) for v in (3.17e-07, 1e-05, 6.3e-03)] == ["3.2e-7", "1e-5", "6.3e-3"]
    assert "Not measured on this device yet." in "\n".join(pages._parity_lines(with_backend, {}))
    # every run the parity check trains has a name in the users' words, each its own
    from lightning_anyaccel.kit.tools import parity_run

    names = [*parity_run.STRATEGIES, *parity_run.FABRIC]
    labels = [pages.parity_name(name) for name in names]
    assert not [name for name, label in zip(names, labels) if label == name], labels
    assert len(set(labels)) == len(labels), labels
    assert pages.parity_name("fabric_deepspeed_3_offload") == "DeepSpeed ZeRO-3, offloaded, Fabric"
