"""Example: a LightningCLI application that knows nothing about lightning-anyaccel.

    python examples/cli_app.py fit --config examples/cli_app.yaml                     # CPU (Lightning's choice)
    LIGHTNING_ANYACCEL_ACTIVATE=1 python examples/cli_app.py fit --config examples/cli_app.yaml

Its Trainer comes from the YAML config and the command line, and neither names a device. With
lightning-anyaccel installed and ``LIGHTNING_ANYACCEL_ACTIVATE=1`` in the environment, the package is
imported as soon as this program imports Lightning, and ``Trainer()`` trains on the device torch
reports: all of them, with DDP for several (docs/programs.md). Nothing in this file changes.
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(LightningModule):
    """A two-layer MLP on a regression problem; reports where it trained and how the loss moved."""

    def __init__(self, features: int = 16, hidden: int = 32, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.losses: list[float] = []
        self.trained_on: set[str] = set()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.trained_on.add(str(next(self.parameters()).device))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def on_fit_end(self) -> None:
        sys.stdout.write(f"rank {self.global_rank} of {self.trainer.world_size}: trained on"
                         f" {', '.join(sorted(self.trained_on))} with {type(self.trainer.strategy).__name__},"
                         f" loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f}\n")  # one write: ranks share stdout
        sys.stdout.flush()


class RegressionData(LightningDataModule):
    """``y = X @ w + noise``, made here from a seed: nothing is downloaded."""

    def __init__(self, samples: int = 512, features: int = 16, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.hparams.seed)
        x = torch.randn(self.hparams.samples, self.hparams.features, generator=generator)
        y = x @ torch.randn(self.hparams.features, 1, generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)


if __name__ == "__main__":
    LightningCLI(Regression, RegressionData, save_config_kwargs={"overwrite": True})
