"""The tutorial's data and model: scikit-learn's digits and a small CNN (notebook 2 teaches them).

1,797 real 8x8 handwritten digits ship inside scikit-learn (no download; read from its data file),
split once, stratified and with a fixed seed, into 70 % train, 15 % validation and 15 % held-out
test. Nothing here knows about a device: Lightning moves the model and the batches.

Example::

    >>> from lightning_anyaccel.kit.tutorial.digits import digits_splits
    >>> [len(split) for split in digits_splits()]
    [1257, 270, 270]
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

__all__ = ["DigitsCNN", "DigitsDataModule", "accuracy", "digits_splits"]


def _digits_file() -> Path:
    """scikit-learn's copy of the digits (``sklearn/datasets/data/digits.csv.gz``, what ``load_digits``
    reads), found without importing scikit-learn: its import (SciPy with it) costs each training
    process more CPU than the training itself."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    raise FileNotFoundError(
        "the tutorial's digits ship with scikit-learn, which has no digits.csv.gz here: "
        'pip install "lightning-anyaccel[tutorial]" (or scikit-learn>=1.4)')


def _stratified_split(labels: torch.Tensor, fraction: float,
                      generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions into ``labels``: (kept, held out), ``ceil(fraction x n)`` held out, each class in
    proportion (the rounding shared out by the largest remainders), both shuffled."""
    classes, counts = labels.unique(return_counts=True)
    wanted = [fraction * int(c) for c in counts]
    held = [math.floor(w) for w in wanted]
    missing = math.ceil(fraction * len(labels)) - sum(held)
    for i in sorted(range(len(classes)), key=lambda i: held[i] - wanted[i])[:missing]:
        held[i] += 1
    kept_parts, held_parts = [], []
    for label, n_held in zip(classes, held):
        positions = (labels == label).nonzero().flatten()
        positions = positions[torch.randperm(len(positions), generator=generator)]
        held_parts.append(positions[:n_held])
        kept_parts.append(positions[n_held:])
    kept, held_out = torch.cat(kept_parts), torch.cat(held_parts)
    return (kept[torch.randperm(len(kept), generator=generator)],
            held_out[torch.randperm(len(held_out), generator=generator)])


def digits_splits(seed: int = 0) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train, validation and test sets: images (1, 8, 8) in [0, 1], stratified, fixed by ``seed``."""
    import numpy as np

    data = torch.from_numpy(np.loadtxt(_digits_file(), delimiter=","))  # 64 pixels, then the label
    x = data[:, :64].to(torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = data[:, 64].to(torch.long)
    generator = torch.Generator().manual_seed(seed)
    train, rest = _stratified_split(y, 0.3, generator)
    val_in_rest, test_in_rest = _stratified_split(y[rest], 0.5, generator)
    val, test = rest[val_in_rest], rest[test_in_rest]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val]), TensorDataset(x[test], y[test])


class DigitsDataModule(L.LightningDataModule):
    """The splits as a LightningDataModule; ``batch_size`` is the batch per process.

    Under DDP, Lightning gives every process a DistributedSampler: each sees 1/N of the training set
    per epoch, and the global batch is batch_size x N.
    """

    def __init__(self, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed

    @override
    def setup(self, stage: str | None = None) -> None:
        self.train_set, self.val_set, self.test_set = digits_splits(self.seed)

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    @override
    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.val_set, batch_size=256)

    @override
    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.test_set, batch_size=256)


class DigitsCNN(L.LightningModule):
    """Two 3x3 convolutions, max-pooling, one linear layer; Adam.

    Logs train_loss/train_acc per step and epoch (Lightning names them train_loss_step,
    train_loss_epoch, ...) and val_loss/val_acc/test_acc per epoch, averaged over processes.
    """

    def __init__(self, lr: float = 0.01, channels: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
            nn.Flatten(),
            nn.Linear(channels * 16, 10),
        )

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x).float()  # a float32 loss under mixed precision too
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        on_step = stage == "train"
        for name, value in ((f"{stage}_loss", loss), (f"{stage}_acc", acc)):
            self.log(name, value, on_step=on_step, on_epoch=True, sync_dist=True)
        return loss

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    @override
    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    @override
    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def accuracy(model: nn.Module, dataset: TensorDataset) -> float:
    """Accuracy of ``model`` on ``dataset``, computed on the model's current device."""
    device = next(model.parameters()).device
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        pred = model(x.to(device)).argmax(dim=1).cpu()
    return float((pred == y).float().mean())
