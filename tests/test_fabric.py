"""Lightning Fabric with the package, in real processes on the device under test (``--device``, CPU by
default): one device, DDP (popen/spawn/fork), bf16 autocast inside the step, collectives, save with 2
processes / load with 1, notebook fork. What the Trainer does too (16-mixed scaler on the device, the DDP
names and instances) is tested once for both front ends in ``test_trainer_cpu.py``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning import Fabric

import lightning_anyaccel  # noqa: F401
from lightning_anyaccel.fabric import AnyAccelerator, AnySingleDeviceStrategy

from conftest import device_under_test, rank_device

SCRIPT = Path(__file__).parent / "scripts" / "fabric_train.py"
# A bound that only catches hangs, never a slow but correct run: a 2-process spawn run takes about
# 20 s on an idle 2-core machine and was measured at 113-131 s on a loaded one (issue #22). Kept
# under pytest's per-test timeout (300 s, pyproject.toml) so a hang reports the children's output.
DDP_TIMEOUT = 280


def read_ranks(out: Path, n: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def run_script(runner, out: Path, *extra: str, timeout: float = DDP_TIMEOUT) -> list[dict[str, Any]]:
    proc = runner([str(SCRIPT), "--out", str(out), *extra], timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return read_ranks(out)


def check_ddp(ranks: list[dict[str, Any]], strategy_class: str = "AnyDDPStrategy") -> None:
    """What every 2-process run must show: our strategy, the device's backend, collectives right, ranks in sync."""
    device = device_under_test()
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2
        assert r["strategy"] == f"lightning_anyaccel.fabric.strategies.{strategy_class}"
        assert r["backend"] == device.backend
        assert r["device"] == r["param_device"] == rank_device(device, r["rank"])
        assert r["all_reduce_sum"] == 3.0  # 1 + 2
        assert r["all_reduce_mean"] == 1.5
        assert r["all_gather"] == [0, 1]
        assert r["broadcast"] == {"token": "from-rank-0"}
        assert r["step"] == 4
    assert ranks[0]["pid"] != ranks[1]["pid"]
    assert ranks[0]["weights"] == ranks[1]["weights"], "DDP did not keep the replicas in sync"
    assert ranks[0]["losses"] != ranks[1]["losses"], "both ranks saw the same data (no distributed sampler)"


@pytest.fixture(scope="module")
def popen_bf16_run(tmp_path_factory, request) -> tuple[Path, list[dict[str, Any]]]:
    """One popen DDP run, bf16-mixed, saving a checkpoint with 2 processes (shared by two tests)."""
    from conftest import run_python

    out = tmp_path_factory.mktemp("popen")
    ranks = run_script(run_python, out, "--strategy", "any_ddp", "--precision", "bf16-mixed",
                       "--save", str(out / "ckpt.pt"))
    return out, ranks


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_fabric_ddp_popen_bf16_collectives_and_save(popen_bf16_run, device_type) -> None:
    out, ranks = popen_bf16_run
    check_ddp(ranks)
    for r in ranks:
        assert r["launcher"] == "_SubprocessScriptLauncher"
        assert r["precision"] == "MixedPrecision" and r["precision_device"] == device_type
        # the script asserted it inside every step too; here the record says so per step and in forward
        assert r["autocast_in_step"] == [[True, "torch.bfloat16"]] * 4
        assert r["autocast_in_forward"] == [[device_type, True, "torch.bfloat16"]]
    assert (out / "ckpt.pt").is_file()


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_fabric_load_with_one_process_continues(popen_bf16_run, tmp_path, monkeypatch) -> None:
    """A checkpoint saved by 2 processes loads into 1: weights restored, step count continues."""
    import sys

    sys.path.insert(0, str(SCRIPT.parent))
    monkeypatch.setattr(sys, "path", sys.path)
    import fabric_train

    saved_out, saved = popen_bf16_run
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    args = fabric_train.argparse.Namespace(precision="32-true", steps=3, out=str(tmp_path), save=None,
                                           load=str(saved_out / "ckpt.pt"))
    fabric = Fabric(accelerator="any", strategy="any_single", devices=1)
    record = fabric.launch(fabric_train.run, args)
    assert record["loaded_digest"] == saved[0]["weights"]
    assert record["step"] == 4 + 3
    assert record["world_size"] == 1 and record["backend"] is None
    assert record["weights"] != saved[0]["weights"]  # it trained on after loading


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_fabric_ddp_spawn(python_runner, tmp_path, device_type) -> None:
    ranks = run_script(python_runner, tmp_path, "--strategy", "any_ddp_spawn")
    check_ddp(ranks)
    assert {r["launcher"] for r in ranks} == {"AnyMultiProcessingLauncher"}
    off = [False, str(torch.get_autocast_dtype(device_type))]  # the device's default autocast dtype
    assert ranks[0]["autocast_in_step"] == [off] * 4  # 32-true: autocast off
    parent = json.loads((tmp_path / "parent.json").read_text())
    assert parent["pid"] not in {r["pid"] for r in ranks}
    assert parent["result"]["weights"] == ranks[0]["weights"]  # launch() returned rank 0's result


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_fabric_ddp_fork(python_runner, tmp_path) -> None:
    ranks = run_script(python_runner, tmp_path, "--strategy", "any_ddp_fork")
    check_ddp(ranks)
    parent = json.loads((tmp_path / "parent.json").read_text())
    assert parent["pid"] not in {r["pid"] for r in ranks}
    assert parent["result"]["rank"] == 0


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


@pytest.mark.device_generic
def test_fabric_single_device_loop_bf16(tmp_path, monkeypatch, device_type) -> None:
    """In-process: a real Fabric loop on one device, bf16 autocast active inside the step."""
    import sys

    monkeypatch.setattr(sys, "path", [str(SCRIPT.parent), *sys.path])
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import fabric_train

    args = fabric_train.argparse.Namespace(precision="bf16-mixed", steps=4, out=str(tmp_path), save=None, load=None)
    fabric = Fabric(accelerator=AnyAccelerator(), strategy=AnySingleDeviceStrategy(), devices=1,
                    precision="bf16-mixed")
    assert fabric.strategy.precision is fabric._precision  # aligned before Fabric cached it
    record = fabric.launch(fabric_train.run, args)
    assert record["strategy"].endswith("fabric.strategies.AnySingleDeviceStrategy")
    assert record["precision_device"] == device_type
    assert record["autocast_in_step"] == [[True, "torch.bfloat16"]] * 4
    assert record["autocast_in_forward"] == [[device_type, True, "torch.bfloat16"]]
    assert record["all_reduce_sum"] == 1.0 and record["broadcast"] == {"token": "from-rank-0"}
    assert len(record["losses"]) == 4 and all(0 < v < 1e3 for v in record["losses"])
