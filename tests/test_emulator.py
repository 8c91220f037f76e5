"""The emulated accelerator itself (lightning_anyaccel.kit.emulator): what it must do for the device-generic suite to mean something.

Each check runs in a fresh interpreter, because a process hosts one emulated device type under one
name and the fork checks need a parent in a known state. The device names are the PrivateUse1
vendors' (npu, sdaa, mlu, musa), a neutral one the package's table does not know, and torch's
built-in xpu and hpu (served on their own dispatch keys).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import AUTOLOAD, LEAN_IMPORTS, SRC, TESTS, run_python
from device_passes import skip_repeat

NAMES = ["npu", "sdaa", "mlu", "musa", "emu", "xpu", "hpu"]
#: PrivateUse1 names whose self-check repeats npu's (the same emulator code: PrivateUse1 renamed, the vendor's
#: stand-in made from the device table by the same function), each loaded by another test of this suite or pass:
#: sdaa by tests/test_deepspeed_devices.py, mlu by test_one_variable_makes_the_device_exist_in_any_process, a name
#: in no table (emu) by pass acme, whose device-generic tests train bf16-mixed on ``acme`` with the spec derived
#: from torch; musa's backend name is checked without loading it
#: (test_emulated_devices_register_their_vendors_backend_name). ANYACCEL_RUN_REPEATS=1 checks them too.
REPEATED_NAMES = {"sdaa": "tests/test_deepspeed_devices.py loads sdaa",
                  "mlu": "test_one_variable_makes_the_device_exist_in_any_process loads mlu",
                  "emu": "pass acme trains the device-generic tests on a name in no table",
                  "musa": "test_emulated_devices_register_their_vendors_backend_name checks musa's backend name"}
#: What a child needs on ``PYTHONPATH``: this checkout's package, and the tests' import trimming
#: (tests/lean_imports: about 3 s of CPU less for each child that imports Lightning).
CHILD_PATH = [str(SRC), str(LEAN_IMPORTS)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    env["PYTHONPATH"] = os.pathsep.join(CHILD_PATH)
    return {**env, **extra}


def _loaded_first(name: str) -> dict[str, str]:
    """The environment of a process that has the device ``name`` before anything imports the package: the
    package's registration asks ``torch.accelerator`` which device there is, and torch keeps that answer, so
    torch's own ``xpu``/``hpu`` must be served before (the autoload hook, as ``emulate`` starts programs)."""
    return _env(LIGHTNING_ANYACCEL_EMULATE=name, PYTHONPATH=os.pathsep.join([str(AUTOLOAD), *CHILD_PATH]))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_emulated_device_and_lightning_fit(name):
    """Memory statistics, device guard, copies, CPU-kernel compute equal to CPU's, autocast, GradScaler,
    RNG, storage resize, save/load and the bad-fork state, and what kernels change in place (BatchNorm running
    statistics, optimizer state) equal to CPU's; then (npu, xpu, hpu, and a name the package does not know,
    with no code: the spec is derived from torch) a bf16-mixed Lightning fit on it. The device-generic suite
    (``pytest -m device_generic --device emulated:npu``) trains on it in depth."""
    if name in REPEATED_NAMES:
        skip_repeat(f"npu's self-check (PrivateUse1 renamed); {REPEATED_NAMES[name]}")
    fit = name in ("npu", "emu", "xpu", "hpu")
    proc = run_python(["-m", "lightning_anyaccel.kit.emulator.selfcheck", name, *(["--fit"] if fit else [])],
                      env=_loaded_first(name), cwd=TESTS,
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
    code = ("from lightning_anyaccel.kit import emulator; emulator.load('npu')\n"
            "try:\n    emulator.load('mlu')\nexcept RuntimeError as err:\n    print('REFUSED', err)\n")
    proc = run_python(["-c", code], env=_env(), cwd=TESTS, timeout=120)
    assert "REFUSED" in proc.stdout and "already loaded as 'npu'" in proc.stdout, proc.stdout[-2000:]


def test_build_is_cached():
    """A second build finds the compiled library and compiles nothing (what `make emulator` relies on); the
    folder names the torch version and the source's hash, in the cache the variable names."""
    from lightning_anyaccel.kit.emulator import build

    lib = build.build()
    mtime = lib.stat().st_mtime
    assert build.build() == lib and lib.stat().st_mtime == mtime
    assert lib.parent.name.startswith("torch-") and lib.parent.name.endswith(build.source_hash())
    if os.environ.get(build.CACHE_ENV):
        assert lib.parent.parent == Path(os.environ[build.CACHE_ENV])


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
    # the labels are padded to the longest, the vendor package's: the emulator's, lightning_anyaccel
    for needle in ("device spec                         : derived from PyTorch (no table entry)",
                   "autocast dtypes                     : none (32-true only)",
                   "vendor package (lightning_anyaccel) : ",
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


# --- strictness: what a discrete device does and the emulated device must do too ----------------------
# (operands on another device, the capacity and the caching allocator are device-generic checks, which
# every emulated pass runs: tests/test_device_rules.py)


#: Run with the device loaded at start (``_loaded_first``): the package itself is never imported.
HOST_READS = """
import ctypes, os, resource, signal, numpy, torch
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
x = torch.arange(4.0, device="npu") * 2
print("RESULT copied:", x.cpu().tolist(), float(x.sum()), flush=True)
pointer = x.data_ptr()
reads = {"ctypes": lambda: ctypes.string_at(pointer, 4),
         "numpy": lambda: numpy.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), (4,)).sum()}
for how, read in reads.items():  # in a forked child: it reads nothing of the device through torch
    pid = os.fork()
    if pid == 0:
        print("RESULT read by", how, ":", read(), flush=True)
        os._exit(0)
    status = os.waitpid(pid, 0)[1]
    print("RESULT", how, "ended by:", signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else status,
          flush=True)
"""


def test_host_code_can_not_read_device_memory():
    """A device pointer dereferenced on the host (ctypes, NumPy over ``data_ptr()``) ends the process naming the
    cause, as on a discrete device; copies and the device's own kernels read the same memory."""
    proc = run_python(["-c", HOST_READS], env=_loaded_first("npu"), cwd=TESTS, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "RESULT copied: [0.0, 2.0, 4.0, 6.0] 12.0" in proc.stdout, proc.stdout[-2000:]
    for how in ("ctypes", "numpy"):
        assert f"RESULT {how} ended by: SIGSEGV" in proc.stdout and f"read by {how}" not in proc.stdout, proc.stdout
    assert proc.stdout.count("the host read or wrote emulated npu device memory directly") == 2, proc.stdout


#: Run with the device loaded at start (``_loaded_first``): the package itself is never imported.
STREAMS = """
import time, torch
module = torch.get_device_module("{name}")
x = torch.arange(4.0, device="{name}")
main, side = torch.accelerator.current_stream(), torch.Stream(device="{name}")

def result(name, value):
    print(f"RESULT {{name}}: {{value}}", flush=True)

with module.stream(side):
    y = x * 2
result("missing wait", y.cpu().tolist())
main.wait_stream(side)
result("after wait_stream", y.cpu().tolist())
with module.stream(side):
    z = torch.tensor([1.0, 2.0]).to("{name}", non_blocking=True)
    w = z + 1
    done = side.record_event()
result("copy, missing wait", w.cpu().tolist())
main.wait_event(done)
result("copy, after wait_event", w.cpu().tolist())
with module.stream(side):
    v = x - 1
module.synchronize()
result("after synchronize", v.cpu().tolist())
start, end = torch.Event(device="{name}", enable_timing=True), torch.Event(device="{name}", enable_timing=True)
start.record()
time.sleep(0.05)
end.record()
end.synchronize()
result("elapsed at least 50 ms", start.elapsed_time(end) >= 50)
"""


@pytest.mark.parametrize("name", ["npu", "xpu", "hpu"])
def test_a_missing_wait_on_a_side_stream_shows(name):
    """What a side stream wrote is garbage (NaN) to the current stream until it waits (``wait_stream``,
    ``wait_event``, ``synchronize``); events measure the time between them. On ``hpu``, as on Gaudi (whose
    runtime resolves data dependencies between streams, and DeepSpeed leaves out its waits there), the
    results are visible at once."""
    proc = run_python(["-c", STREAMS.format(name=name)], env=_loaded_first(name), cwd=TESTS, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = dict(line[len("RESULT "):].split(": ", 1) for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    ordered = name == "hpu"
    assert results["missing wait"] == ("[0.0, 2.0, 4.0, 6.0]" if ordered else "[nan, nan, nan, nan]")
    assert results["after wait_stream"] == "[0.0, 2.0, 4.0, 6.0]"
    assert results["copy, missing wait"] == ("[2.0, 3.0]" if ordered else "[nan, nan]")
    assert results["copy, after wait_event"] == "[2.0, 3.0]"
    assert results["after synchronize"] == "[-1.0, 0.0, 1.0, 2.0]"
    assert results["elapsed at least 50 ms"] == "True"


def test_the_autoload_alone_gives_a_device_of_the_capacity_asked(tmp_path):
    """As docs/emulator.md shows it: only the autoload folder on ``PYTHONPATH`` (no import error in the
    process), ``memory=SIZE`` in the variable: an allocation past it is ``torch.OutOfMemoryError``."""
    code = ("import torch\n"
            "print('TOTAL', torch.npu.get_device_properties(1).total_memory, torch.npu.mem_get_info(1))\n"
            "try:\n"
            "    torch.empty(65 << 20, dtype=torch.uint8, device='npu:1')\n"
            "except torch.OutOfMemoryError as err:\n"
            "    print('OOM', err)\n")
    proc = run_python(["-c", code], env={"LIGHTNING_ANYACCEL_EMULATE": "npu:2:memory=64MiB", "PYTHONPATH": str(AUTOLOAD)},
                      cwd=tmp_path, timeout=120)
    assert proc.returncode == 0 and "Error in sitecustomize" not in proc.stdout, proc.stdout[-2000:]
    assert "TOTAL 67108864 (67108864, 67108864)" in proc.stdout, proc.stdout[-2000:]
    assert ("OOM NPU out of memory. Tried to allocate 65.00 MiB. NPU 1 has a total capacity of 64.00 MiB"
            in proc.stdout), proc.stdout[-2000:]
