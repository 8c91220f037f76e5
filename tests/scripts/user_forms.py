"""The vendor READMEs' first example, as their users write it: the accelerator and a device count, no strategy.

One form per run (``--form``), each on CPU for real with 2 processes:

- ``trainer``: ``from lightning import Trainer``; ``Trainer(accelerator="any", devices=2)``;
- ``pl-trainer``: ``import pytorch_lightning as pl``; ``pl.Trainer(accelerator="any", devices=2)``;
- ``fabric``: ``from lightning import Fabric``; ``Fabric(accelerator="any", devices=2)``;
- ``fabric-standalone``: ``from lightning_fabric import Fabric`` (the package of ``pytorch_lightning``).

Run it with ``python`` (the strategy Lightning picks starts the second process) or under a launcher
(``torchrun --nproc-per-node 2``). Every rank writes ``<out>/rank<N>.json`` (strategy class and
module, launcher, cluster environment, world size, losses, a digest of the final weights) and
``<out>/pid.<pid>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

FORMS = ("trainer", "pl-trainer", "fabric", "fabric-standalone")


def data() -> TensorDataset:
    """A fixed regression problem (the same on every rank)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=generator)
    return TensorDataset(x, x @ torch.randn(16, 1, generator=generator))


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def record(strategy: Any, rank: int, world_size: int, losses: list[float], module: torch.nn.Module) -> dict[str, Any]:
    launcher = getattr(strategy, "launcher", None) or getattr(strategy, "_launcher", None)
    return {
        "rank": rank,
        "world_size": world_size,
        "strategy": type(strategy).__name__,
        "strategy_module": type(strategy).__module__,
        "launcher": type(launcher).__name__,
        "environment": type(strategy.cluster_environment).__name__,
        "device_type": strategy.root_device.type,
        "losses": losses,
        "weights": digest(module),
        "pid": os.getpid(),
    }


def run_trainer(form: str, out: Path) -> None:
    if form == "pl-trainer":
        import pytorch_lightning as pl
    else:
        import lightning.pytorch as pl
    import lightning_anyaccel  # noqa: F401

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()
            self.losses: list[float] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    trainer = pl.Trainer(accelerator="any", devices=2, max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    model = Regressor()
    trainer.fit(model, DataLoader(data(), batch_size=32))
    report = record(trainer.strategy, trainer.global_rank, trainer.world_size, model.losses, model.net)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def run_fabric(form: str, out: Path) -> None:
    if form == "fabric-standalone":
        from lightning_fabric import Fabric
    else:
        from lightning import Fabric
    import lightning_anyaccel  # noqa: F401

    fabric = Fabric(accelerator="any", devices=2)
    fabric.launch()
    model = net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(data(), batch_size=32))
    losses: list[float] = []
    for _ in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(loss.detach()))
    report = record(fabric.strategy, fabric.global_rank, fabric.world_size, losses, model.module)
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=FORMS, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid.{os.getpid()}").touch()
    torch.set_num_threads(1)
    (run_trainer if "trainer" in args.form else run_fabric)(args.form, out)


if __name__ == "__main__":
    main()
