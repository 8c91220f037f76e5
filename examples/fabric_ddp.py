"""Example: a Lightning Fabric training loop with DDP on whatever accelerator PyTorch reports.

    python examples/fabric_ddp.py                                   # 2 processes on CPU, or 2 devices
    python examples/fabric_ddp.py --accelerator xpu --precision bf16-mixed

``tests/test_snippets.py`` runs it (2 processes on CPU); ``docs/fabric.md`` shows it.
"""

from __future__ import annotations

import argparse

import torch
from lightning import Fabric
from torch.utils.data import DataLoader

import lightning_anyaccel  # noqa: F401  (registers the names "any", "xpu", "any_ddp", ...)
from lightning_anyaccel.kit.tools.demo import demo_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accelerator", default="any", help='"any": the device PyTorch reports')
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    fabric = Fabric(accelerator=args.accelerator, strategy="any_ddp", devices=args.devices,
                    precision=args.precision)
    fabric.launch()  # the popen launcher re-runs this script once per further device
    fabric.seed_everything(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)  # DDP on fabric.device
    dataloader = fabric.setup_dataloaders(DataLoader(demo_data(), batch_size=16, shuffle=True))
    loss_fn = torch.nn.MSELoss()
    for epoch in range(args.epochs):
        total = torch.zeros((), device=fabric.device)
        for x, y in dataloader:  # this process's share of the data, already on fabric.device
            optimizer.zero_grad()
            loss = loss_fn(model(x).float(), y)  # forward under autocast on the device type
            fabric.backward(loss)
            optimizer.step()
            total += loss.detach()
        mean = fabric.all_reduce(total / len(dataloader), reduce_op="mean")
        fabric.print(f"epoch {epoch}: mean training loss {float(mean):.4f}")
    fabric.print(f"trained on {fabric.device.type} x {fabric.world_size}")


if __name__ == "__main__":
    main()
