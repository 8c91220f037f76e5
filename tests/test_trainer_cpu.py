"""Real Lightning training on CPU through the package's generic path (no simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy, AnySingleDeviceStrategy
from lightning_anyaccel.demo import DemoModel, demo_loader

TRAIN = str(Path(__file__).parent / "scripts" / "train.py")


def _fit(model=None, **kwargs):
    model = model or DemoModel()
    defaults = dict(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    trainer = Trainer(**{**defaults, **kwargs})
    trainer.fit(model, demo_loader())
    return trainer, model


@pytest.mark.parametrize(
    "flags",
    [
        dict(accelerator=AnyAccelerator(), devices=1),
        dict(accelerator=AnyAccelerator("cpu"), strategy="any_single", devices=1),
        dict(accelerator="any", strategy="any_single", devices=1),
        dict(accelerator="any", strategy=AnySingleDeviceStrategy(), devices="auto"),
    ],
    ids=["instance-auto-strategy", "cpu-any_single", "any-name", "strategy-instance"],
)
def test_single_device_fit_learns(flags):
    trainer, model = _fit(**flags)
    assert trainer.global_step == 6
    assert trainer.strategy.root_device.type == "cpu"
    assert model.losses[-1] < model.losses[0]


def test_bf16_mixed_autocast_active_in_training_step():
    trainer, model = _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1, precision="bf16-mixed")
    assert trainer.precision_plugin.device == "cpu"
    assert model.autocast_seen == [("cpu", "bfloat16")] * 6


def test_16_mixed_uses_device_scaler():
    trainer, model = _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1, precision="16-mixed")
    assert model.autocast_seen and set(model.autocast_seen) == {("cpu", "float16")}
    assert trainer.precision_plugin.scaler is not None
    assert trainer.precision_plugin.scaler._device == "cpu"


def test_32_true_has_no_autocast():
    _, model = _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1)
    assert model.autocast_seen == []


def test_device_stats_monitor_gets_stats(tmp_path):
    logger = CSVLogger(tmp_path, name="stats")
    _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1, logger=logger,
         callbacks=[DeviceStatsMonitor()], log_every_n_steps=1)
    metrics = (Path(logger.log_dir) / "metrics.csv").read_text()
    assert "cpu_percent" in metrics and "cpu_vm_percent" in metrics


def _ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["any_ddp", "any_ddp_spawn", "any_ddp_fork"])
def test_ddp_two_processes(python_runner, tmp_path, strategy):
    proc = python_runner([TRAIN, "--strategy", strategy, "--devices", "2", "--precision", "bf16-mixed",
                          "--out", str(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = _ranks(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1]
    for record in ranks:
        assert record["world_size"] == 2
        assert record["strategy"] == "AnyDDPStrategy"
        assert record["backend"] == "gloo"
        assert record["precision_device"] == "cpu"
        assert record["autocast_seen"] == [["cpu", "bfloat16"]]
        assert record["global_step"] == 8
    # gradients were all-reduced: identical weights on both ranks, different data per rank
    assert ranks[0]["weights"] == ranks[1]["weights"]
    assert ranks[0]["losses"] != ranks[1]["losses"]


@pytest.mark.slow
def test_lightnings_ddp_spawn_with_any_accelerator_keeps_ranks_in_sync(python_runner, tmp_path):
    """torch puts spawned CPU weights in shared memory; Lightning unshares them only for its own
    CPUAccelerator. Without the package's fix both ranks step the same weights and drift apart.
    (Lightning's *class*: the name ``"ddp_spawn"`` selects the package's strategy, see test_user_forms.py.)"""
    proc = python_runner([TRAIN, "--strategy", "lightning:ddp_spawn", "--devices", "2", "--out", str(tmp_path)],
                         timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = _ranks(tmp_path)
    assert [r["strategy"] for r in ranks] == ["DDPStrategy", "DDPStrategy"]
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
def test_checkpoint_from_two_processes_resumes_on_one(python_runner, tmp_path):
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "run1", tmp_path / "run2"
    out1.mkdir(), out2.mkdir()
    first = python_runner([TRAIN, "--strategy", "any_ddp", "--devices", "2", "--max-steps", "4",
                           "--out", str(out1), "--ckpt-dir", str(ckpt)], timeout=240)
    assert first.returncode == 0, first.stdout[-4000:]
    assert (ckpt / "last.ckpt").exists()
    saved = torch.load(ckpt / "last.ckpt", map_location="cpu", weights_only=False)
    assert saved["global_step"] == 4
    second = python_runner([TRAIN, "--strategy", "any_single", "--devices", "1", "--max-steps", "8",
                            "--out", str(out2), "--resume", str(ckpt / "last.ckpt")], timeout=240)
    assert second.returncode == 0, second.stdout[-4000:]
    (record,) = _ranks(out2)
    assert record["world_size"] == 1
    assert record["global_step"] == 8
    assert len(record["losses"]) == 4  # continued from step 4, did not restart


def test_ddp_strategy_instance_and_names_register():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    for name in ("any_single", "any_ddp", "any_ddp_spawn", "any_ddp_fork", "any_ddp_notebook"):
        assert name in StrategyRegistry
    for name in ("any", "xpu", "hpu", "npu", "sdaa", "mlu", "musa"):
        assert name in AcceleratorRegistry
    assert AcceleratorRegistry["cpu"]["accelerator"].__module__.startswith("lightning.")  # Lightning keeps its own
    trainer = Trainer(accelerator=AnyAccelerator(), strategy=AnyDDPStrategy(start_method="spawn"), devices=2,
                      logger=False)
    assert trainer.strategy.launcher.__class__.__name__ == "AnyMultiProcessingLauncher"
    assert trainer.world_size == 2
