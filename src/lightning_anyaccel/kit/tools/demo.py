"""A tiny, real model and data set used by ``verify``, the tests and the examples.

The data set is a fixed random regression problem (no download); the model is a two-layer
MLP. :class:`DemoModel` records whether ``torch.autocast`` was active (and on which device
type) inside ``training_step``, so callers can prove mixed precision really ran.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override


def demo_data(n: int = 256, features: int = 16, seed: int = 0, split: str = "train") -> TensorDataset:
    """A deterministic regression data set: ``y = X @ w + noise``.

    ``seed`` fixes the problem (the weight ``w``) and the training samples. ``split="val"`` gives
    ``n // 4`` new samples of the **same** problem (same ``w``): held-out data to validate on.
    A different ``seed`` is a different problem, not held-out data.
    """
    if split not in ("train", "val"):
        raise ValueError(f'split must be "train" or "val", not {split!r}')
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    w = torch.randn(features, 1, generator=generator)
    if split == "val":
        generator = torch.Generator().manual_seed(seed + 1_000_003)  # other samples, same w
        x = torch.randn(n // 4, features, generator=generator)
    y = x @ w + 0.01 * torch.randn(len(x), 1, generator=generator)
    return TensorDataset(x, y)


def demo_loader(batch_size: int = 32, **kwargs: Any) -> DataLoader:
    """A ``DataLoader`` over :func:`demo_data` (no shuffling: runs are reproducible)."""
    return DataLoader(demo_data(**kwargs), batch_size=batch_size)


class DemoModel(LightningModule):
    """A two-layer MLP that records the autocast state seen inside ``training_step``."""

    def __init__(self, features: int = 16, hidden: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
        self.autocast_seen: list[tuple[str, str]] = []
        self.losses: list[float] = []

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            self.autocast_seen.append((device_type, str(torch.get_autocast_dtype(device_type)).replace("torch.", "")))
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.losses.append(float(loss.detach()))
        self.log("train_loss", loss, prog_bar=False)
        return loss

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x).float(), y), sync_dist=True)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
