"""The vendor READMEs' first example with Fabric, as their users write it: the accelerator and a device count.

One form per run (``--form``), each on CPU for real with 2 processes (the Trainer's forms are the DDP
program of ``tests/test_compat_fit.py``):

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

FORMS = ("fabric", "fabric-standalone")


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
    run_fabric(args.form, out)


if __name__ == "__main__":
    main()
