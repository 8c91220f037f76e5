"""Checkpoints written on a device load and resume on a machine without that device.

A CPU build cannot create XPU tensors, so the test makes ``torch.save`` *tag* CPU storages as
``xpu:0`` (what a real XPU checkpoint records). Loading such a file here fails with torch's
defaults — the test shows that first — and works through the package.
"""

from __future__ import annotations

import pytest
import torch
import torch.serialization as serialization
from lightning import Trainer

import lightning_anyaccel  # noqa: F401
from lightning_anyaccel import AnyAccelerator, portable_map_location
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader


@pytest.fixture
def saved_as_xpu(monkeypatch):
    """While active, ``torch.save`` records every CPU storage as living on ``xpu:0``."""
    registry = list(serialization._package_registry)
    registry.insert(0, (0, lambda storage: "xpu:0" if storage.device.type == "cpu" else None, lambda s, loc: None))
    monkeypatch.setattr(serialization, "_package_registry", registry)
    yield
    monkeypatch.undo()


def _trainer(**kwargs):
    return Trainer(accelerator=AnyAccelerator(), logger=False, enable_progress_bar=False, enable_model_summary=False,
                   **kwargs)


def test_xpu_tagged_tensor_loads_on_cpu(tmp_path, saved_as_xpu):
    path = tmp_path / "t.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    serialization._package_registry[:] = serialization._package_registry[1:]  # stop tagging for the loads
    with pytest.raises(RuntimeError, match="(?i)xpu"):
        torch.load(path, weights_only=True)
    loaded = torch.load(path, map_location=portable_map_location, weights_only=True)
    assert loaded["w"].device.type == "cpu"
    assert torch.equal(loaded["w"], torch.arange(4.0))


def test_trainer_resumes_from_a_device_checkpoint(tmp_path, monkeypatch):
    trainer = _trainer(strategy="any_single", devices=1, max_steps=3, enable_checkpointing=False)
    trainer.fit(DemoModel(), demo_loader())
    path = tmp_path / "xpu.ckpt"
    registry = [(0, lambda s: "xpu:0" if s.device.type == "cpu" else None, lambda s, loc: None),
                *serialization._package_registry]
    with monkeypatch.context() as patch:
        patch.setattr(serialization, "_package_registry", registry)
        trainer.save_checkpoint(path)

    # Lightning's `load_from_checkpoint` default cannot place xpu tensors on this machine ...
    with pytest.raises(RuntimeError, match="(?i)xpu"):
        DemoModel.load_from_checkpoint(path)

    # ... resuming with the package's strategies works (Lightning reads onto CPU first), from step 3 ...
    model = DemoModel()
    resumed = _trainer(strategy="any_single", devices=1, max_steps=6, enable_checkpointing=False)
    resumed.fit(model, demo_loader(), ckpt_path=path)
    assert resumed.global_step == 6
    assert len(model.losses) == 3
    assert next(model.parameters()).device.type == "cpu"

    # ... and `portable_map_location` makes `load_from_checkpoint` work too.
    reloaded = DemoModel.load_from_checkpoint(path, map_location=portable_map_location)
    assert next(reloaded.parameters()).device.type == "cpu"
