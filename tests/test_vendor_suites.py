"""The vendor plugins' tests as the measure: the runner (``make vendor-suites``) and the record it wrote.

The run itself needs the vendors' checkouts and takes minutes (docs/evidence.md); here, fast:

- the committed record ``docs/records/vendor/suites.toml`` is what a run wrote (its digest), its counts
  agree with its failures, and every failure has a reason the page explains;
- a record edited by hand fails the site's build (the directive refuses it);
- the reasons are matched on the failures' messages, and a message no reason matches is ``unclassified``;
- the runner refuses a folder that is not a git checkout, naming the commands that make one.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import vendor_suites  # noqa: E402  (docs/_ext: the directive's reader)


def _runner():
    spec = importlib.util.spec_from_file_location("vendor_suites_run", ROOT / "scripts" / "vendor_suites" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_record_is_what_the_run_wrote() -> None:
    record = vendor_suites.load(ROOT / vendor_suites.RECORD)
    run = _runner()
    assert record["kind"] == "vendor-suites"
    assert {name: s["commit"] for name, s in record["suites"].items()} == {n: s.commit for n, s in run.SUITES.items()}
    assert [(f["suite"], f["file"]) for f in record["files"]] == [(s, f) for s, f, _ in run.FILES]
    for entry in record["files"]:
        failures = entry.get("failures", {})
        assert entry["failed"] + entry["error"] == len(failures), entry["file"]
        assert entry["categories"] == dict(Counter(f["category"] for f in failures.values())), entry["file"]
        assert {f["category"] for f in failures.values()} <= {*record["categories"], "unclassified"}


def test_a_record_edited_by_hand_is_refused(tmp_path) -> None:
    text = (ROOT / vendor_suites.RECORD).read_text()
    edited = tmp_path / "suites.toml"
    edited.write_text(text.replace("passed = ", "passed = 1", 1))
    with pytest.raises(ValueError, match="edited after the run wrote it"):
        vendor_suites.load(edited)


def test_failures_are_sorted_by_their_message() -> None:
    run = _runner()
    assert run.categorise("t.py::test_init", "AssertionError: assert device(type='hpu', index=0) == device(type='hpu')"
                          ) == "numbered_devices"
    assert run.categorise("t.py::test_hpu_ddp_strategy_device_not_hpu", "Failed: DID NOT RAISE AssertionError") == "ddp_on_cpu"
    assert run.categorise("t.py::test_fused", "VendorPrivateError: habana_frameworks.torch.hpex.optimizers.FusedSGD is ..."
                          ) == "vendor_private"
    assert run.categorise("t.py::test_cli[hpu_ddp]", "[XPASS(strict)] String strategy `hpu_ddp` not registered") == "works_here"
    assert run.categorise("t.py::test_other", "Failed: DID NOT RAISE AssertionError") == "unclassified"


def test_the_runner_wants_git_checkouts(tmp_path) -> None:
    run = _runner()
    with pytest.raises(SystemExit, match=r"not a git checkout of lightning-habana: `git clone https://github.com/Lightning-AI"):
        run.main(["--habana", str(tmp_path), "--teco", str(tmp_path), "--record", str(tmp_path / "r.toml")])
    assert not (tmp_path / "r.toml").exists()
