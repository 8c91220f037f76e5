"""The emulated accelerator itself (tests/emulator): what it must do for the device-generic suite to mean something.

Each check runs in a fresh interpreter, because a process hosts one emulated device type under one
name and the fork checks need a parent in a known state. The device names are the PrivateUse1
vendors' (npu, sdaa, mlu, musa), a neutral one the package's table does not know, and torch's
built-in xpu and hpu (served on their own dispatch keys).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import AUTOLOAD, SRC, TESTS, run_python

NAMES = ["npu", "sdaa", "mlu", "musa", "emu", "xpu", "hpu"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(SRC)])
    return {**env, **extra}


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_emulated_device_and_lightning_fit(name):
    """Memory statistics, device guard, copies, CPU-kernel compute equal to CPU's, autocast, GradScaler,
    RNG, storage resize, save/load and the bad-fork state, and what kernels change in place (BatchNorm running
    statistics, optimizer state) equal to CPU's; then (npu, xpu, hpu, and a name the package does not know,
    with no code: the spec is derived from torch) a bf16-mixed Lightning fit on it. The device-generic suite
    (``pytest -m device_generic --device emulated:npu``) trains on it in depth."""
    fit = name in ("npu", "emu", "xpu", "hpu")
    proc = run_python(["-m", "emulator.selfcheck", name, *(["--fit"] if fit else [])], env=_env(), cwd=TESTS,
                      timeout=240)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-4000:]
    assert not fit or "FIT OK" in proc.stdout, proc.stdout[-4000:]


def test_one_variable_makes_the_device_exist_in_any_process(tmp_path):
    """The autoload hook: LIGHTNING_ANYACCEL_EMULATE + PYTHONPATH, no code in the script."""
    code = "import torch; print(torch.accelerator.current_accelerator(), torch.accelerator.device_count())"
    env = _env(LIGHTNING_ANYACCEL_EMULATE="mlu:3")
    env["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), env["PYTHONPATH"]])
    proc = run_python(["-c", code], env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "mlu 3", proc.stdout[-2000:]
    plain = run_python(["-c", code], env=_env(), cwd=tmp_path, timeout=120)
    assert plain.stdout.strip().splitlines()[-1] == "None 0", plain.stdout[-2000:]


def test_a_second_name_in_one_process_is_refused():
    code = ("import emulator; emulator.load('npu')\n"
            "try:\n    emulator.load('mlu')\nexcept RuntimeError as err:\n    print('REFUSED', err)\n")
    proc = run_python(["-c", code], env=_env(), cwd=TESTS, timeout=120)
    assert "REFUSED" in proc.stdout and "already loaded as 'npu'" in proc.stdout, proc.stdout[-2000:]


def test_build_is_cached():
    """A second build finds the compiled library and compiles nothing (what `make emulator` relies on)."""
    sys.path.insert(0, str(TESTS))
    from emulator import _build_ext

    lib = _build_ext.build()
    mtime = lib.stat().st_mtime
    assert _build_ext.build() == lib and lib.stat().st_mtime == mtime
    assert Path(lib).parent.name.startswith("torch-")


@pytest.mark.slow
def test_a_lesser_backend_nobody_described(tmp_path):
    """Zero configuration on ``acme`` (in no table, no package code), with a backend lacking shallow copies,
    autocast and collectives (emulator options, docs/emulator.md): Fabric and the Trainer re-point optimizers
    built before the move (weights really change on the device), and ``devices=2``, a user's gloo and
    bf16-mixed are refused naming the fix, with ``accelerator="acme"`` and with no accelerator argument alike
    (``Trainer()``, ``Fabric()``); ``verify`` prints its full report and fails, one line per failure."""
    env = _env(LIGHTNING_ANYACCEL_EMULATE="acme:2:noshallow,noautocast,nocollectives")
    env["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), env["PYTHONPATH"]])
    proc = run_python([str(TESTS / "scripts" / "lesser_backend.py")], env=env, cwd=tmp_path, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    results = dict(line[len("RESULT "):].split(": ", 1) for line in out.splitlines() if line.startswith("RESULT "))
    assert results["device"] == "acme"
    assert results["plain torch weights unchanged"] == "True", "noshallow did not make the move replace the parameters"
    assert results["fabric replaced"] == "True"
    assert results["fabric optimizer params"] == "['acme:0']" and results["fabric optimizer holds the model's"] == "True"
    assert results["fabric momentum on"] == "['acme:0']" and results["fabric weights changed"] == "True"
    assert results["setup_module then optimizer"] == "True"
    assert results["foreign optimizer"].startswith("StaleParametersError:") and "setup_module(model) first" in out
    assert results["trainer optimizer params in training_step"] == "['acme:0:model']"
    assert results["trainer weights changed"] == "True"
    assert results["two devices"].startswith("BackendError:") and "one device only" in results["two devices"]
    assert "Backend.register_backend(NAME, create_fn, devices=['acme'])" in results["two devices"]
    assert results["gloo"].startswith("BackendError: process_group_backend='gloo' can not carry")
    assert results["bf16"].startswith("PrecisionNotSupportedError:") and "Choose one of: '32-true'" in results["bf16"]
    # no accelerator argument (Trainer(), Fabric()): the device is found, and refused the same way
    assert results["auto two devices"] == results["auto fabric two devices"] == results["any fabric two devices"] \
        == results["two devices"]
    assert results["auto bf16"] == results["auto fabric bf16"] == results["any fabric bf16"] == results["bf16"]
    assert results["verify status"] == "1"
    for needle in ("device spec               : derived from PyTorch (no table entry)",
                   "autocast dtypes           : none (32-true only)", "vendor package (emulator) : imported",
                   "[PASS] single-device fit: 4 steps on acme:0", "[FAIL] 2-process collective: BackendError:",
                   "[FAIL] bf16 autocast: PrecisionNotSupportedError:", "[PASS] checkpoint round trip",
                   "VERIFICATION FAILED (failed: 2-process collective, bf16 autocast)"):
        assert needle in out, needle
    assert "Traceback" not in out


@pytest.mark.slow
def test_collectives_complete_later_and_a_backend_without_avg(tmp_path):
    """The emulated backend as a device's: an ``async_op=True`` result lands at ``wait()`` (a missing wait reads
    the old value), through ``get_future()`` too (DDP's buckets: both ranks end with equal weights), in the
    order the works were issued; with option ``noavg`` it refuses ``ReduceOp.AVG``, and the package still
    gives the mean of ``self.log(..., sync_dist=True)``, ``strategy.reduce`` and ``fabric.all_reduce``, and
    FSDP2 trains (its gradients reduced with a sum)."""
    env = _env(LIGHTNING_ANYACCEL_EMULATE="acme:2:noavg")
    env["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), env["PYTHONPATH"]])
    proc = run_python([str(TESTS / "scripts" / "collectives_run.py")], env=env, cwd=tmp_path, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    results = dict(line[len("RESULT "):].split(": ", 1) for line in out.splitlines() if line.startswith("RESULT "))
    for rank, own in ((0, "1.0"), (1, "2.0")):
        assert results[f"rank{rank} read before wait"] == f"[{own}, {own}, {own}]", "the result landed before wait()"
        assert results[f"rank{rank} read after wait"] == "[3.0, 3.0, 3.0]"
        assert results[f"rank{rank} future"] == "[[3.0, 3.0]]"
        assert results[f"rank{rank} issue order"] == "[2.0, True]"
        assert results[f"rank{rank} avg"].startswith("RuntimeError: emuccl: ReduceOp.AVG is not supported")
        for mean in ("logged mean", "strategy.reduce mean", "fabric.all_reduce mean"):
            assert results[f"rank{rank} {mean}"] == "1.5", mean
        assert results[f"rank{rank} fsdp2"] == "none" and results[f"rank{rank} fsdp2 steps"] == "2"
    assert results["rank0 ddp weights"] == results["rank1 ddp weights"]
