"""Sharded training for real on CPU: 2 processes, gloo, through the package's strategies.

Each strategy trains the same wide MLP on the same data as DDP (``examples/shard_train.py``):
the per-rank losses must match DDP's, each rank must hold only part of the parameters (FSDP,
FSDP2, ZeRO-3) or of the optimizer state (ZeRO-1/2) and measure less live memory than a DDP
rank, and a checkpoint written after the first epoch must resume exactly like DDP resumes
(weights *and* optimizer state restored). Each strategy trains and resumes in one 2-process job
(``--resume-steps``: a new model and Trainer in the same processes), so a format costs one launch of
two interpreters, not two.

Fabric (``tests/scripts/fabric_shard.py``): one 2-process run covers DDP as the reference, FSDP
with full and sharded checkpoints, FSDP2 with distributed and full checkpoints and, when
installed, DeepSpeed ZeRO-3. What both front ends decide without starting processes (names,
precision, refusals) is tested once for both in ``test_sharding_errors.py``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from conftest import ROOT, rank_device, run_python

RUN = str(Path(__file__).parent / "scripts" / "shard_run.py")
#: Wide enough that memory per rank shows the sharding (8.4 M parameters, 34 MB in fp32).
MODEL = ["--width", "1024", "--depth", "8"]
#: DeepSpeed's shared-memory CPU collectives compile for about a minute; gloo is enough here.
ENV = {"ANYACCEL_DS_NO_SHM": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / "build" / "torch_extensions")}
TIMEOUT = 420
FABRIC_SCRIPT = Path(__file__).parent / "scripts" / "fabric_shard.py"
#: Where DeepSpeed caches ops it compiles (none for ZeRO-3 on gloo; the Trainer tests share it).
FABRIC_ENV = {"TORCH_EXTENSIONS_DIR": str(ROOT / "build" / "torch_extensions")}
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])",
)


def _ranks(out: Path) -> list[dict]:
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    return ranks


def _train(out: Path, strategy: str, *extra: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    proc = run_python([RUN, "--strategy", strategy, *MODEL, "--out", str(out), *extra], timeout=TIMEOUT, env=ENV)
    if proc.returncode != 0:  # DeepSpeed floods the log with deprecation warnings: show the rest
        lines = [line for line in proc.stdout.splitlines() if "Warning" not in line and "return func(" not in line]
        pytest.fail(f"{strategy} exited with {proc.returncode}:\n" + "\n".join(lines[-80:]))
    return _ranks(out)


def _train_and_resume(out: Path, strategy: str, ckpt: Path) -> tuple[list[dict], list[dict]]:
    """One 2-process job: 3 steps (one epoch) checkpointed to ``ckpt``, then, in the same processes, a new
    model and Trainer resumed from ``ckpt/last.ckpt`` to 6 steps (``--resume-steps``)."""
    first = _train(out, strategy, "--max-steps", "3", "--ckpt-dir", str(ckpt), "--resume-steps", "6")
    return first, _ranks(out / "resumed")


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> list[dict]:
    """The reference: plain DDP, one epoch of 3 steps, checkpointed, then resumed to 6 steps.

    Resuming is compared with DDP resumed the same way, not with an uninterrupted run: Lightning
    restarts the data at an epoch-end checkpoint differently than it continues a running fit.
    """
    root = tmp_path_factory.mktemp("ddp")
    first, second = _train_and_resume(root / "run", "ddp", root / "ckpt")
    for a, b in zip(first, second):
        a["resumed_losses"] = b["losses"]
    return first


def _assert_losses(got: list[dict], ddp: list[dict], key: str = "losses") -> None:
    for rank, reference in zip(got, ddp):
        torch.testing.assert_close(rank["losses"], reference[key], rtol=1e-4, atol=1e-5)


# strategy, is the checkpoint a folder (sharded), are parameters sharded (else: optimizer state only)
FORMATS = [
    pytest.param("fsdp", False, True, id="fsdp-full"),
    pytest.param("fsdp_sharded", True, True, id="fsdp-sharded"),
    pytest.param("fsdp2", True, True, id="fsdp2-distributed"),
    pytest.param("fsdp2_full", False, True, id="fsdp2-full"),
    pytest.param("deepspeed_3", True, True, id="deepspeed3", marks=needs_deepspeed),
]


@pytest.mark.slow
@pytest.mark.parametrize("strategy, folder, params_sharded", FORMATS)
def test_sharded_training_matches_ddp_and_resumes(tmp_path, ddp, strategy, folder, params_sharded):
    ckpt = tmp_path / "ckpt"
    first, second = _train_and_resume(tmp_path / "run", strategy, ckpt)
    total = first[0]["total_numel"]
    assert ddp[0]["param_numel"] == total  # DDP: every rank holds everything
    held = [r["param_numel"] for r in first]
    if params_sharded:
        assert all(n < 0.6 * total for n in held), held
        assert sum(held) >= total, held  # the shards cover the model (DeepSpeed pads them)
    states = [r["optimizer_state_numel"] for r in first]
    assert all(n < 0.6 * ddp[0]["optimizer_state_numel"] for n in states), states
    _assert_losses(first, ddp)
    for rank, reference in zip(first, ddp):  # measured in each rank: live memory at step boundaries
        assert rank["peak_mib"] < 0.8 * reference["peak_mib"], (rank, reference)

    last = ckpt / "last.ckpt"
    assert last.is_dir() is folder
    assert [r["global_step"] for r in second] == [6, 6]
    _assert_losses(second, ddp, "resumed_losses")  # as DDP resumed: weights and optimizer state restored

    if strategy.startswith("deepspeed"):  # DeepSpeed's folder -> one full fp32 file, loadable anywhere
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        full = tmp_path / "full.ckpt"
        convert_zero_checkpoint_to_fp32_state_dict(last, full)
        state = torch.load(full, map_location="cpu", weights_only=False)["state_dict"]
        assert sum(t.numel() for t in state.values()) == total


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("strategy", ["deepspeed_2_offload"])
def test_deepspeed_zero_partitions_optimizer_state(tmp_path, ddp, strategy):
    """ZeRO-2 with the optimizer offloaded (the package checks the offload device). ZeRO-1 differs only in
    the stage number DeepSpeed receives (``any_deepspeed_stage_1``); ZeRO-2 without offload trains in
    tests/test_journeys.py (the Aurora script under MPI)."""
    ranks = _train(tmp_path, strategy, "--max-steps", "3")
    assert all(r["strategy"] == "AnyDeepSpeedStrategy" for r in ranks)
    assert [r["param_numel"] for r in ranks] == [ranks[0]["total_numel"]] * 2  # ZeRO-1/2 keep full parameters
    states = [r["optimizer_state_numel"] for r in ranks]
    assert all(n < 0.6 * ddp[0]["optimizer_state_numel"] for n in states), states
    _assert_losses(ranks, ddp)


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_parameters_sharded_on_the_device_under_test(tmp_path, strategy, device):
    """FSDP and FSDP2 with 2 processes on the device under test (``--device``): each rank holds about half
    the parameters, as tensors on its own device."""
    if device.is_cpu:
        pytest.skip("on CPU, test_sharded_training_matches_ddp_and_resumes checks sharding in depth")
    ranks = _train(tmp_path / strategy, strategy, "--width", "256", "--depth", "4", "--max-steps", "3",
                   "--device-type", device.type)
    total = ranks[0]["total_numel"]
    held = [r["param_numel"] for r in ranks]
    assert all(n < 0.6 * total for n in held) and sum(held) >= total, held
    expected = [rank_device(device, 0), rank_device(device, 1)]
    assert [r["param_device"] for r in ranks] == expected
    assert all(r["global_step"] == 3 and len(r["losses"]) == 3 for r in ranks)


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2", pytest.param("deepspeed_2", marks=needs_deepspeed)])
def test_one_process_on_a_one_device_machine(tmp_path, strategy, device):
    """A machine with one device (one GPU): each distributed strategy trains as 1 process on it, with the
    device's collective backend and its parameters on the device. Machines with 2 or more devices run the
    2-process tests above instead."""
    if device.count >= 2:
        pytest.skip(f"{device.count} {device.type} devices: the 2-process tests cover every strategy")
    if strategy.startswith("deepspeed") and device.emulated:
        pytest.skip("DeepSpeed has no accelerator for the emulated device (it imports the vendor's package)")
    out = tmp_path / "run"
    out.mkdir()
    proc = run_python([RUN, "--strategy", strategy, "--devices", "1", "--device-type", device.type, "--max-steps", "3",
                       "--out", str(out)], timeout=TIMEOUT, env=ENV)
    assert proc.returncode == 0, proc.stdout[-4000:]
    # Lightning's CUDA side stream around DDP made torch warn at every backward (Lightning-AI/pytorch-lightning#21567)
    assert "AccumulateGrad node's stream does not match" not in proc.stdout
    (rank,) = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert rank["global_step"] == 3 and len(rank["losses"]) == 3
    assert rank["backend"] == device.backend  # the device's collective backend, even for one process
    assert rank["param_device"] == f"{device.type}:0"
    assert rank["param_numel"] == rank["total_numel"]  # one process holds everything
    assert all(v == v and v < 1e6 for v in rank["losses"])  # finite


# ----- Fabric: one real run, 2 processes, gloo ------------------------------------------------

@pytest.mark.slow
def test_fabric_sharded_training_matches_ddp_and_reloads(python_runner, tmp_path) -> None:
    extra = ["--deepspeed"] if HAS_DEEPSPEED else []
    proc = python_runner([str(FABRIC_SCRIPT), "--out", str(tmp_path), *extra], timeout=240, env=FABRIC_ENV)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1]
    ddp = [r["ddp"] for r in ranks]
    total = ddp[0]["total_numel"]
    assert [r["local_numel"] for r in ddp] == [total, total]
    assert ddp[0]["losses"] != ddp[1]["losses"]  # each rank saw its own half of the data

    expected = {  # configuration: (strategy class, checkpoint is a folder)
        "fsdp_full": ("AnyFSDPStrategy", False),
        "fsdp_sharded": ("AnyFSDPStrategy", True),
        "fsdp2_sharded": ("AnyModelParallelStrategy", True),
        "fsdp2_full": ("AnyModelParallelStrategy", False),
    }
    if HAS_DEEPSPEED:
        expected["deepspeed_3"] = ("AnyDeepSpeedStrategy", True)
    for name, (strategy, folder) in expected.items():
        got = [r[name] for r in ranks]
        assert {g["strategy"] for g in got} == {f"lightning_anyaccel.fabric.strategies.{strategy}"}, name
        held = [g["local_numel"] for g in got]
        assert all(n < 0.6 * total for n in held) and sum(held) >= total, (name, held, total)
        for g, reference in zip(got, ddp):
            torch.testing.assert_close(g["losses"], reference["losses"], rtol=1e-4, atol=1e-5, msg=name)
            # the reloaded model and optimizer replay the last steps exactly (momentum restored)
            torch.testing.assert_close(g["resumed_losses"], g["losses"][3:], rtol=0, atol=1e-6, msg=name)
            assert g["resumed_weights_difference"] < 1e-6, name
            assert g["loaded_step"] == 3, name
            assert g["checkpoint_is_dir"] is folder, name
    assert {r["fsdp2_sharded"]["mesh_device_type"] for r in ranks} == {"cpu"}
    assert {r["hybrid_mesh_device_type"] for r in ranks} == {"cpu"}  # Lightning builds the tuple on "cuda"
