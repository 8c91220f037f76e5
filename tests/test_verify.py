"""``python -m lightning_anyaccel.verify``: real run on CPU, and the failure paths."""

from __future__ import annotations

import json

import pytest

from lightning_anyaccel.kit import verify


@pytest.mark.feature("verify")
def test_verify_passes_on_cpu(capsys):
    """The command's code path on CPU, in this process (a new interpreter would only import torch and Lightning
    again: test_verify_passes_on_the_device_under_test starts the command as a user does, on the emulated
    devices); its 2-process collective still spawns its own processes."""
    status = verify.main([])
    out = capsys.readouterr().out
    assert status == 0, out[-4000:]
    for needle in ("device type        : cpu (CPU)", "collective backend : gloo", "autocast dtypes    : bf16, fp16",
                   "torch              : ", "lightning          : ", "[PASS] single-device fit",
                   "[PASS] 2-process collective: all_reduce over 2 processes with 'gloo'",
                   "[PASS] bf16 autocast", "[PASS] checkpoint round trip", "VERIFICATION SUCCESSFUL"):
        assert needle in out


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.feature("verify")
@pytest.mark.one_device
def test_verify_passes_on_the_device_under_test(python_runner, device):
    """`python -m lightning_anyaccel.verify --device <type>` is green on the device under test."""
    if device.is_cpu:
        pytest.skip("test_verify_passes_on_cpu checks cpu")
    proc = python_runner(["-m", "lightning_anyaccel.verify", "--device", device.type], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    two = device.count >= 2
    collective = (f"[PASS] 2-process collective: all_reduce over 2 processes with '{device.backend}'"
                  if two else  # a one-GPU machine: skipped, saying why (not failed, not faked, not a pass)
                  f"[SKIP] 2-process collective: needs 2 {device.type} devices, found {device.count}")
    verdict = "VERIFICATION SUCCESSFUL" if two else "VERIFICATION PASSED WITH 1 SKIPPED (skipped: 2-process collective)"
    for needle in (f"[PASS] single-device fit: 4 steps on {device.type}:0", collective,
                   f"[PASS] bf16 autocast: matmul under autocast('{device.type}', bfloat16) -> torch.bfloat16",
                   f"[PASS] checkpoint round trip: state_dict saved from {device.type}:0", verdict):
        assert needle in proc.stdout, proc.stdout[-4000:]


def test_verify_json_and_missing_device(capsys):
    """In this process: the command line's code path, without paying a new interpreter's imports."""
    status = verify.main(["--device", "xpu", "--json"])
    out = capsys.readouterr().out
    assert status == 1, out[-4000:]
    report = json.loads(out[out.index("{"):])
    assert report["ok"] is False
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["single-device fit"] == "FAIL"
    fit = next(c for c in report["checks"] if c["name"] == "single-device fit")
    assert "sees no Intel GPU (XPU) device" in fit["detail"]


def test_verify_unknown_device_exits_nonzero(capsys):
    """A type neither torch nor the table knows: still the full report, one failed check naming the fix."""
    assert verify.main(["--device", "nosuch"]) == 1
    out = capsys.readouterr().out
    assert "device type        : nosuch (unknown to PyTorch here and to the device table)" in out, out
    assert "[FAIL] device: ValueError: Unknown device type 'nosuch'" in out and "register_device" in out, out
    assert "torch              : " in out and "VERIFICATION FAILED (failed: device)" in out, out
    assert "Traceback" not in out


def test_a_skipped_check_is_not_a_pass(monkeypatch, capsys):
    """One accelerator: the collective is skipped. The verdict names it and is no "SUCCESSFUL"; exit 0, or 1
    with --fail-on-skip."""
    def passes(device_type: str) -> str:
        return "fine"

    def skips(device_type: str) -> str:
        raise verify._Skip("needs 2 cuda devices, found 1")

    monkeypatch.setattr(verify, "CHECKS", [("bf16 autocast", passes), ("2-process collective", skips)])
    report = verify.run("cpu")
    assert report.ok and report.skipped == ["2-process collective"]
    text = report.to_text()
    assert "[SKIP] 2-process collective: needs 2 cuda devices, found 1" in text
    assert text.endswith("VERIFICATION PASSED WITH 1 SKIPPED (skipped: 2-process collective)")
    assert "SUCCESSFUL" not in text
    assert verify.main(["--device", "cpu"]) == 0
    assert verify.main(["--device", "cpu", "--fail-on-skip"]) == 1
    assert "--fail-on-skip: 1 check(s) skipped: 2-process collective" in capsys.readouterr().err
    assert verify.main(["--device", "cpu", "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out[out.index("{"):])["skipped"] == ["2-process collective"]


def test_failed_check_fails_the_report(monkeypatch):
    def broken(device_type: str) -> str:
        raise AssertionError("weights differ after the round trip")

    monkeypatch.setattr(verify, "CHECKS", [("checkpoint round trip", broken)])
    report = verify.run("cpu")
    assert not report.ok
    assert "VERIFICATION FAILED (failed: checkpoint round trip)" in report.to_text()
    assert verify.main(["--device", "cpu"]) == 1


@pytest.mark.parametrize("module", ["device.devices", "checkpoints.optimizer_params", "kit.verify", "kit.tools.records",
                                    "device.runtime", "device.precision", "device.distributed",
                                    "checkpoints.checkpoint", "accelerator", "_compat", "strategies.single",
                                    "device.sharded_precision", "strategies.fsdp", "strategies.model_parallel",
                                    "strategies.deepspeed", "device.sync_batchnorm", "device.compilation",
                                    "cluster.build_locks", "strategies.steps", "strategies.base",
                                    "strategies.multi_process", "strategies.sharded", "strategies.ddp",
                                    "fabric.strategies", "front_ends", "kit.tools.local_runs", "_lightning.stubs",
                                    "checkpoints.atomic_commit", "cluster.gloo_interface", "cluster.rendezvous",
                                    "_lightning", "_lightning.porting", "_lightning.names", "_lightning.accessors",
                                    "wiring.auto", "wiring.activation", "device.spec", "strategies.families",
                                    "strategies.deepspeed_checks"])
def test_docstring_examples(module):
    import doctest
    import importlib

    mod = importlib.import_module(f"lightning_anyaccel.{module}")
    if module.startswith("strategies.deepspeed"):
        # DeepSpeed logs its accelerator choice to stdout when it is first imported: import it before the
        # examples run, so that they compare only their own output whatever ran before in this process
        importlib.import_module("deepspeed")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
