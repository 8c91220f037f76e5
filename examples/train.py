"""Example: train the demo model with DDP on whatever accelerator PyTorch reports.

    python examples/train.py                 # 2 processes on CPU, or 2 devices of your accelerator
    python examples/train.py --devices 1 --precision bf16-mixed
    mpiexec -n 24 -ppn 12 python train.py --devices 12 --num_nodes 2   # what scripts/launch/aurora.pbs runs

The same file runs unchanged on XPU, Gaudi, Ascend, CUDA, ...: only ``AnyAccelerator()`` looks at
the hardware. It validates on held-out samples of the same regression problem before and after
training and exits with 1 if training did not lower that loss.
"""

from __future__ import annotations

import argparse
import sys

import lightning as L

from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy, AnySingleDeviceStrategy
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--devices", type=int, default=2, help="devices (processes) per node")
    parser.add_argument("--num-nodes", "--num_nodes", dest="num_nodes", type=int, default=1,
                        help="nodes of the job (the Intel Aurora example spells it --num_nodes)")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-epochs", type=int, default=3)
    args = parser.parse_args()

    L.seed_everything(42)
    strategy = AnyDDPStrategy() if args.devices * args.num_nodes > 1 else AnySingleDeviceStrategy()
    trainer = L.Trainer(
        accelerator=AnyAccelerator(),
        strategy=strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        precision=args.precision,
        max_epochs=args.max_epochs,
        logger=False,
        enable_checkpointing=False,
    )
    model = DemoModel()
    held_out = demo_loader(split="val")  # new samples of the training problem
    before = trainer.validate(model, held_out, verbose=False)[0]["val_loss"]
    trainer.fit(model, demo_loader(), held_out)
    after = float(trainer.callback_metrics["val_loss"])
    if trainer.is_global_zero:
        print(f"trained on {trainer.strategy.root_device.type} x {trainer.world_size} for"
              f" {args.max_epochs} epochs: held-out mean squared error {before:.3f} before training,"
              f" {after:.4f} after")
        print("next: the tutorial notebooks (make lab), the documentation site (make docs,"
              " then _build/html/index.html)")
    if not after < before:
        sys.exit(f"training did not lower the held-out loss ({before:.3f} -> {after:.4f})")


if __name__ == "__main__":
    main()
