"""What only Lightning Fabric has, with the package, in real processes: DDP launched from a notebook
(fork). What the Trainer does too (one device and bf16 autocast in the step, DDP with popen/spawn/fork and
collectives, save with 2 processes / load with 1, the 16-mixed scaler on the device, the DDP names and
instances) is tested once for both front ends in ``test_trainer_cpu.py``."""

from __future__ import annotations

import json
import textwrap

import pytest

import lightning_anyaccel  # noqa: F401
from conftest import DDP_TIMEOUT

NOTEBOOK = textwrap.dedent(
    """
    import sys
    sys.ps1 = ">>> "   # what an interactive session / Jupyter kernel looks like to Lightning
    import json, torch
    import torch.distributed as dist
    from lightning import Fabric
    import lightning_anyaccel
    from lightning.fabric.utilities.imports import _IS_INTERACTIVE
    assert _IS_INTERACTIVE

    try:
        Fabric(accelerator="any", strategy="any_ddp", devices=2)
    except RuntimeError as err:
        print("POPEN-REFUSED:", err)

    def train(fabric):   # defined in the session: not picklable for spawn, fine for fork
        model, opt = fabric.setup(torch.nn.Linear(4, 1), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
        total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
        return {"world": fabric.world_size, "sum": float(total), "backend": dist.get_backend(),
                "strategy": type(fabric.strategy).__name__}

    fabric = Fabric(accelerator="any", strategy="any_ddp_notebook", devices=2)
    print("RESULT:", json.dumps(fabric.launch(train)))
    """
)


@pytest.mark.slow
def test_fabric_notebook_uses_fork(python_runner, device) -> None:
    proc = python_runner(["-c", NOTEBOOK], timeout=DDP_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "POPEN-REFUSED: strategy='any_ddp' (start method 'popen') can not run from a notebook" in proc.stdout
    assert "Use strategy='any_ddp_notebook' (fork)" in proc.stdout
    result = json.loads(proc.stdout.split("RESULT:", 1)[1].strip().splitlines()[0])
    assert result == {"world": 2, "sum": 3.0, "backend": device.backend, "strategy": "AnyDDPStrategy"}
