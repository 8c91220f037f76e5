"""DeepSpeed on the device types DeepSpeed itself supports, and the emulated vendor devices it trains on.

Where DeepSpeed runs is one rule, ``deepspeed_support`` (DeepSpeed's own accelerator list and probe);
on the emulated PrivateUse1 devices the vendor's package (``torch_sdaa``, ...) is stood in for and the
collective backend carries the vendor's name, so DeepSpeed's own accelerator for the type trains
there. The ZeRO runs check parity with one device on the emulated ``sdaa``, ``npu`` and ``mlu``, each through
DeepSpeed's own accelerator class for the type (``make records`` runs every stage on each: the device-generic
parity test).
"""

from __future__ import annotations

import os

import pytest

from conftest import AUTOLOAD, SRC, run_python
from test_parity import _run_job
from test_sharding_cpu import HAS_DEEPSPEED

needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed"
                                     " (pip install lightning-anyaccel[deepspeed])")


@needs_deepspeed
def test_the_rule_is_deepspeeds_own_list():
    """Every device type of the table is supported exactly when DeepSpeed lists an accelerator of its name;
    where that accelerator imports a vendor package, the answer names it."""
    from deepspeed.accelerator.real_accelerator import SUPPORTED_ACCELERATOR_LIST

    from lightning_anyaccel.device.devices import DEVICE_TABLE, get_spec
    from lightning_anyaccel.strategies.support import deepspeed_support

    for device_type, spec in DEVICE_TABLE.items():
        support = deepspeed_support(spec, probe=False)
        assert support.supported == (device_type in SUPPORTED_ACCELERATOR_LIST), (device_type, support)
        if support.supported and spec.vendor_module:
            assert support.reason == f"needs {spec.vendor_module}"
    assert {t for t, spec in DEVICE_TABLE.items() if deepspeed_support(spec, probe=False).supported} >= {"sdaa", "mlu", "npu", "hpu"}
    assert "DeepSpeed has no accelerator for 'musa'" in deepspeed_support(get_spec("musa"), probe=False).reason


def test_emulated_devices_register_their_vendors_backend_name():
    """hccl on npu, tccl on sdaa, cncl on mlu, mccl on musa (the device table's ``backend``); emuccl for a name
    in no table. In a process with the emulated sdaa: ``import torch_sdaa`` finds the stand-in over ``torch.sdaa``
    and ``tccl`` is the backend torch creates for the device."""
    from lightning_anyaccel.device.devices import DEVICE_TABLE
    from lightning_anyaccel.kit.emulator import backend_name

    for name in ("npu", "sdaa", "mlu", "musa"):
        assert backend_name(name) == DEVICE_TABLE[name].backend
    assert [backend_name(n) for n in ("npu", "sdaa", "mlu", "musa", "acme")] == ["hccl", "tccl", "cncl", "mccl", "emuccl"]
    code = ("import torch, torch.distributed as dist, torch_sdaa\n"
            "assert torch_sdaa.sdaa is torch.sdaa and torch_sdaa._emulated\n"
            "dist.init_process_group('tccl', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
            "t = torch.ones(2, device='sdaa'); dist.all_reduce(t)\n"
            "print('BACKEND', dist.get_default_backend_for_device('sdaa'), t.device.type)\n")
    env = {**os.environ, "LIGHTNING_ANYACCEL_EMULATE": "sdaa", "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), str(SRC)])}
    proc = run_python(["-c", code], env=env, timeout=240)
    assert proc.returncode == 0 and "BACKEND" in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.split("BACKEND", 1)[1].split()[:2] == ["tccl", "sdaa"]


#: The emulated vendor devices DeepSpeed trains on, each through its own accelerator class of DeepSpeed's
#: (``sdaa_accelerator``, ``npu_accelerator``, ``mlu_accelerator``: different code), and the ZeRO stages run there:
#: both stages on sdaa, one each on npu and mlu (the stage's code is DeepSpeed's and the same on every device).
ZERO_RUNS = {"sdaa": ["deepspeed_2", "deepspeed_3"], "npu": ["deepspeed_2"], "mlu": ["deepspeed_3"]}


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("device_type", list(ZERO_RUNS))
def test_deepspeed_zero_on_the_emulated_vendor_devices_reproduces_one_device(tmp_path, monkeypatch, device_type):
    """``strategy="any_deepspeed_stage_2"`` or stage 3 on 2 emulated devices of a vendor type: DeepSpeed's own
    accelerator for that type (the package refuses any other in the worker), the vendor's backend name (``tccl``,
    ``hccl``, ``cncl``), gradients and updates within the fp32 tolerance of the serial run on one device."""
    from lightning_anyaccel.kit.tools import parity
    from lightning_anyaccel.kit.tools.parity_run import judge

    runs = ZERO_RUNS[device_type]
    # the job's processes get the emulated device through the autoload hook
    monkeypatch.setenv("LIGHTNING_ANYACCEL_EMULATE", f"{device_type}:2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(AUTOLOAD), os.environ.get("PYTHONPATH", str(SRC))]))
    out = _run_job(tmp_path, device_type, runs, f"DeepSpeed on the emulated {device_type}")
    for run in runs:
        report = judge(out, run, processes=2)
        assert report.steps == parity.STEPS
        assert max(report.norm, report.grad, report.update) <= parity.RTOL, report.line()
