"""The validation kit, ``python -m lightning_anyaccel.validate``: it runs on the device under test and writes
a record the support matrix reads; a missing device is one line; interrupted, it leaves no process and no
record. (From a wheel in a fresh venv: tests/test_release.py.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil
import pytest

from conftest import ROOT
from lightning_anyaccel import validate
from lightning_anyaccel.tools import records


@pytest.mark.slow
@pytest.mark.device_generic
def test_the_kit_validates_the_device_under_test(python_runner, tmp_path, device):
    """A short run (a checkpoint saved on the device and resumed, and DDP): progress shown, the record written with
    the level, the processes and the features its checks proved, and nothing else; the checks not asked for are not
    in it. DDP is judged by parity with one device: the record carries the largest relative differences."""
    path = tmp_path / "record.toml"
    proc = python_runner(["-m", "lightning_anyaccel.validate", "--device", device.type, "--checks", "checkpoint,ddp",
                          "--record", str(path)], cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "[ 1/2] checkpoint ..." in proc.stdout and "[ 2/2] ddp: PASSED" in proc.stdout, proc.stdout[-2000:]
    text = path.read_text()
    assert records.problems(text) == []
    record = records.loads(text)
    processes = min(2, device.count)
    assert (record["device_type"], record["level"], record["runner"]) == (device.type, device.level,
                                                                         "lightning_anyaccel.validate")
    assert record["features"] == {"checkpoint": "passed",
                                  "ddp": "passed" if processes == 2 else "passed (1 process)"}
    assert record["tests"]["validate::ddp"]["processes"] == processes == record["max_processes"]
    assert record["tests"]["validate::ddp"]["reason"].startswith(
        f"{processes} process{'es' if processes == 2 else ''} on {device.type}, backend {device.backend}")
    assert "; matches one device: 3 steps, largest relative difference" in record["tests"]["validate::ddp"]["reason"]
    measured = record["tests"]["validate::ddp"]["parity"]  # judged by parity with one device, not by the loss
    assert set(measured) == {"steps", "norm", "grad", "update", "rtol", "atol"}
    assert max(measured["norm"], measured["grad"], measured["update"]) <= measured["rtol"] == 1e-5
    assert set(record["tests"]) == {"validate::checkpoint", "validate::ddp"}
    if record["commit_source"] == "git":  # this checkout, the package installed from it (editable)
        assert record["commit"] == subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                                  text=True).stdout.strip()


def test_a_device_the_machine_lacks_is_one_line(capsys, tmp_path):
    assert validate.main(["--device", "xpu", "--record", str(tmp_path / "r.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this machine has no 'xpu' device" in err, err
    assert not list(tmp_path.iterdir())


def test_a_skipped_check_says_why_and_proves_nothing():
    check = validate.BY_NAME["collective"]
    assert validate.skip_reason(check, "cpu", 1) == "needs 2 cpu devices, found 1"
    assert validate.skip_reason(validate.BY_NAME["16-mixed"], "mps", 1) is None
    summary = records.summarise({"validate::collective": records.Outcome("skipped", (), None, "needs 2")})
    assert summary["features"] == {} and summary["skipped"] == 1


@pytest.mark.slow
def test_an_interrupted_run_ends_its_processes_and_writes_no_record(tmp_path):
    path = tmp_path / "record.toml"
    kit = subprocess.Popen([sys.executable, "-m", "lightning_anyaccel.validate", "--device", "cpu", "--checks",
                            "ddp,fit", "--record", str(path)], cwd=tmp_path, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        assert kit.stdout is not None
        assert kit.stdout.readline().startswith("validating cpu")
        assert kit.stdout.readline().startswith("[ 1/2] ddp ...")
        deadline = time.monotonic() + 120
        children: list[psutil.Process] = []
        while time.monotonic() < deadline and len(children) < 2:  # the worker and the rank it launched
            children = psutil.Process(kit.pid).children(recursive=True)
            time.sleep(0.2)
        assert children, "the check's worker never started"
        kit.send_signal(signal.SIGTERM)
        out, _ = kit.communicate(timeout=60)
    finally:
        kit.kill()
    assert kit.returncode == 130, out
    assert "interrupted (SIGTERM)" in out and "no record written" in out, out
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"left behind: {alive}"
    assert not list(tmp_path.glob("*.toml")) and not list(tmp_path.glob(".*partial"))
