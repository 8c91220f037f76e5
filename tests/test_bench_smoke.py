"""Smoke test for benchmarks/: every benchmark runs with tiny sizes and writes a well-formed results file.

No timing is asserted: only that the code runs, the schema holds and the measured numbers are positive.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from benchmarks.common import SCHEMA, write_json  # the repository root is on pytest's pythonpath
from benchmarks.run import SECTIONS, TINY, run_all

ROOT = Path(__file__).resolve().parents[1]


def _medians(node: Any) -> Iterator[float]:
    """Every ``median`` of a summary and every bandwidth in the document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("median", "gbps", "busbw_gbps", "median_s", "steps_per_s") and isinstance(value, (int, float)):
                yield float(value)
            else:
                yield from _medians(value)
    elif isinstance(node, list):
        for item in node:
            yield from _medians(item)


@pytest.mark.slow
@pytest.mark.timeout(480)  # ~1 min of CPU; a loaded CI machine stretches it
def test_benchmarks_run_tiny(tmp_path: Path) -> None:
    doc = run_all(TINY, SECTIONS, log=lambda _: None)
    errors = {name: doc[name].get("traceback", doc[name]["error"]) for name in SECTIONS if "error" in doc[name]}
    assert not errors, errors

    assert doc["schema"] == SCHEMA
    meta = doc["meta"]
    for key in ("date", "machine", "versions", "device", "settings", "runtime_s"):
        assert key in meta, key
    assert set(meta["versions"]) == {"python", "torch", "lightning", "lightning_anyaccel"}
    assert meta["machine"]["cpu_model"] and meta["machine"]["cpu_cores_logical"] >= 1
    assert meta["device"]["type"]

    ov = doc["overhead"]
    assert set(ov["steps_per_s"]) >= {"plugin", "plain"}
    assert "plugin/plain" in ov["ratios"]
    assert all(calls > 0 for calls in ov["calls_per_step"].values())
    assert ov["profiler_sessions"]["plugin"] == 0 < ov["profiler_sessions"]["plugin+profiler"]  # only when asked
    if meta["device"]["lightning_builtin"]:
        assert ov["classes"]["plugin"].startswith("AnyAccelerator")
        assert "plugin/builtin" in ov["ratios"] and isinstance(ov["goal_met"], bool)

    tr = doc["transformer"]  # GPT-2: skipped, saying why, without transformers
    assert "skipped" in tr or ({"plugin", "plain"} <= set(tr["tokens_per_s"]) and "plugin/plain" in tr["ratios"])
    if "skipped" not in tr and meta["device"]["lightning_builtin"]:
        assert "plugin/builtin" in tr["ratios"] and isinstance(tr["goal_met"], bool)

    st = doc["strategies"]
    if "skipped" not in st:
        assert set(st["families"]) == {"ddp", "fsdp", "fsdp2", "deepspeed"}
        for family, result in st["families"].items():
            if family == "deepspeed" and "skipped" in result:
                assert importlib.util.find_spec("deepspeed") is None
                continue
            if family == "deepspeed" and meta["device"]["type"] not in ("cpu", "cuda") and result.get("errors"):
                continue  # DeepSpeed's accelerator layer may not serve this device (e.g. an emulated one)
            assert not result.get("errors"), (family, result.get("errors"))
            assert {"plugin", "raw"} <= set(result["steps_per_s"]), family
            assert "plugin/raw" in result["ratios"] and "plugin/raw vs lightning/raw" in result["goals"]
            assert result["calls_per_step"]["plugin"] and result["calls_per_step"]["raw"]
            # Lightning's own strategy ran, or its refusal was recorded (FSDP, DeepSpeed: CUDA only)
            assert "lightning" in result["steps_per_s"] or "lightning" in result["refused"] or not \
                meta["device"]["lightning_builtin"], family
            if st["settings"]["rounds"] >= 2:
                assert result["spread_vs_steps"]["plugin/raw"]
        assert set(st["families"]["ddp"]["efficiency"]) >= {"plugin", "raw"}
        if meta["device"]["lightning_builtin"]:  # Lightning's DDP runs on every device it has an accelerator for
            assert "plugin/lightning" in st["families"]["ddp"]["ratios"]
        kn = st["knobs"]["ddp"]
        measured = {k for k in st["knobs"]["options"] if f"plugin+{k}" in kn["steps_per_s"]}
        assert measured | {k.removeprefix("plugin+") for k in kn["refused"]} == set(st["knobs"]["options"])
        assert all(f"plugin+{k}/plugin" in kn["ratios"] for k in measured)
    co = doc["collective"]
    assert co["memcpy"] and all(row["gbps"] > 0 for row in co["memcpy"])
    if "skipped" not in co:
        assert co["backend"] == meta["device"]["backend"]
        assert [r["bytes"] for r in co["all_reduce"]] == [r["bytes"] for r in co["memcpy"]]
    fs = doc["first_step"]["seconds"]
    for method, phases in fs.items():
        assert set(phases) == {"import", "launch_rendezvous", "first_step", "total"}, method

    dc = doc["device_calls"]  # tiny: the device against CPU (CPU against itself on a CPU run)
    assert dc["calls_per_step"][meta["device"]["type"]] > 0 and dc["device_module_calls_per_step"] >= 0
    if meta["device"]["type"] == "cpu":
        assert dc["differing_in_package"] == [] and dc["device_module_calls_per_step"] == 0

    values = list(_medians(doc))
    assert values and all(v > 0 for v in values), values

    # the file round-trips and renders into a page that names machine, versions and date
    results = tmp_path / "results.json"
    write_json(results, doc)
    from benchmarks import report

    page = tmp_path / "benchmarks.md"
    written = report.render(results, page=page, images=tmp_path / "img")
    text = page.read_text()
    assert written[0] == page
    for needle in (meta["date"], meta["versions"]["torch"], meta["machine"]["cpu_model"], "## 1. Plugin overhead", "## 1b. A transformer",
                   "## 2. Strategies side by side"):
        assert needle in text
    assert json.loads(results.read_text())["schema"] == SCHEMA


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_emulated_device_adds_no_per_step_device_calls() -> None:
    """On the tests' emulated device (when the checkout has it), the plugin's step calls no device-module function."""
    from benchmarks import device_calls, run

    if not run.EMULATOR_AUTOLOAD.is_dir():
        pytest.skip("no emulated device in this checkout (src/lightning_anyaccel/kit/emulator)")
    dc = device_calls.run("cpu")  # a CPU run measures the emulated device in a child process
    assert dc["emulated"]["device"]["type"] == device_calls.EMULATED_NAME
    assert dc["device_module_functions"] > 0  # the device module was found, so a call would have been counted
    assert dc["device_module_calls_per_step"] == 0, dc["device_module_calls"]
    assert dc["differing_in_package"] == [], dc["differing_in_package"]


def test_emulated_device_option_names_what_is_missing(capsys: pytest.CaptureFixture[str], monkeypatch,
                                                      tmp_path) -> None:
    """A checkout without the emulator (an sdist, a copy of benchmarks/): ``--device emulated:NAME`` says where it is
    missing, before anything runs."""
    from benchmarks import run

    missing = tmp_path / "autoload"
    monkeypatch.setattr(run, "EMULATOR_AUTOLOAD", missing)
    with pytest.raises(SystemExit):
        run.main(["--device", "emulated:npu", "--only", "overhead"])
    err = capsys.readouterr().err
    assert f"the emulated device is not in this checkout ({missing} missing)" in err and "without --device" in err


@pytest.mark.parametrize("results", sorted(p.name for p in (ROOT / "benchmarks" / "results").glob("*.json")))
def test_committed_pages_are_rendered_from_their_results(tmp_path, results) -> None:
    """Each device's benchmarks page is exactly what its results file renders to (nothing edited by hand);
    a run on a one-GPU machine says that it ran 1 process."""
    from benchmarks import report

    doc = json.loads((ROOT / "benchmarks" / "results" / results).read_text())
    page, images = report.page_for(doc["meta"]["device"]["type"])
    fresh = tmp_path / page.relative_to(ROOT)
    report.render(ROOT / "benchmarks" / "results" / results, page=fresh, images=tmp_path / images.relative_to(ROOT))
    assert fresh.read_text() == page.read_text(), f"{page.name} is stale: python -m benchmarks.report {results}"
    if doc.get("strategies", {}).get("settings", {}).get("processes") == 1:
        assert "**One device.**" in fresh.read_text() and "1 process (" in fresh.read_text()


def _order_statistic_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """The median's interval as benchmarks/report.py computed it by hand before it asked scipy: the order
    statistics x(j), x(n+1-j) with the largest j whose coverage 1 - 2 P(B <= j-1), B ~ Binomial(n, 1/2), is >= level."""
    data, n, best = sorted(values), len(values), None
    for j in range(1, n // 2 + 1):
        if 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n < level:
            break
        best = (data[j - 1], data[n - j])
    return best


def _round_values(node: Any) -> Iterator[list[float]]:
    """Every per-round ``values`` list of a results file."""
    if isinstance(node, dict):
        if isinstance(node.get("values"), list):
            yield node["values"]
        for value in node.values():
            yield from _round_values(value)
    elif isinstance(node, list):
        for item in node:
            yield from _round_values(item)


def test_median_interval_is_the_order_statistic_interval() -> None:
    """scipy's interval of the median is the one the page always gave: on every per-round list of the committed
    results (so their verdicts stay), on ties, and on 1 to 40 rounds (fewer than 6 give none)."""
    from benchmarks import report

    rng = random.Random(0)
    samples = [v for f in sorted((ROOT / "benchmarks" / "results").glob("*.json"))
               for v in _round_values(json.loads(f.read_text()))]
    assert len(samples) > 20
    samples += [[rng.lognormvariate(0, 0.2) for _ in range(n)] for n in range(1, 41) for _ in range(5)]
    samples += [[float(rng.randint(0, 3)) for _ in range(n)] for n in range(1, 41)]
    for values in samples:
        assert report.median_ci(values) == _order_statistic_interval(values), values
    assert report.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None and report.median_ci([]) is None


def test_results_name_the_commit_given_over_a_stale_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the checkout sent to another machine (a lent GPU) may carry the ``.git`` of an older
    commit: the commit it is given in ``$LIGHTNING_ANYACCEL_COMMIT`` wins over what ``git`` reports."""
    from benchmarks.common import source_revision

    from lightning_anyaccel.kit.tools.records import COMMIT_ENV

    from_git = source_revision()
    assert from_git["from"] == "git" and len(from_git["commit"]) == 40  # this test runs in a git checkout
    monkeypatch.setenv(COMMIT_ENV, "0123456789abcdef0123456789abcdef01234567")
    assert source_revision() == {"commit": "0123456789abcdef0123456789abcdef01234567", "clean": True,
                                 "from": COMMIT_ENV}
    monkeypatch.setenv(COMMIT_ENV, "0123456789abcdef0123456789abcdef01234567-dirty")
    assert source_revision()["clean"] is False


def test_merged_results_keep_each_sections_run() -> None:
    """``--merge``: the sections not run again keep their own date and commit, and the page says which is which."""
    from benchmarks.report import sections_cell
    from benchmarks.run import merged

    def doc(date: str, commit: str, sections: tuple[str, ...]) -> dict[str, Any]:
        meta = {"date": date, "source": {"commit": commit, "clean": True}, "device": {"type": "cuda"}}
        return {"schema": SCHEMA, "meta": meta, **{s: {"run": {"date": date, "source": meta["source"]}} for s in sections}}

    earlier = doc("2026-01-01", "a" * 40, ("transformer", "overhead"))
    earlier["meta"]["corrections"] = ["a correction"]
    both = merged(earlier, doc("2026-01-02", "b" * 40, ("overhead", "strategies")))
    assert both["transformer"]["run"]["date"] == "2026-01-01" and both["overhead"]["run"]["date"] == "2026-01-02"
    assert both["meta"]["corrections"] == ["a correction"]
    assert "transformer: 2026-01-01, commit `aaaaaaaaaaaa`" in sections_cell(both)
    with pytest.raises(ValueError, match="device type"):
        merged({**earlier, "meta": {**earlier["meta"], "device": {"type": "xpu"}}}, both)
