"""Example: train the demo model with DDP on whatever accelerator PyTorch reports.

    python examples/train.py                 # 2 processes on CPU, or 2 devices of your accelerator
    python examples/train.py --devices 1 --precision bf16-mixed

The same file runs unchanged on XPU, Gaudi, Ascend, CUDA, ...: only ``AnyAccelerator()`` looks at
the hardware.
"""

from __future__ import annotations

import argparse

import lightning as L

from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy, AnySingleDeviceStrategy
from lightning_anyaccel.demo import DemoModel, demo_loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-epochs", type=int, default=3)
    args = parser.parse_args()

    L.seed_everything(42)
    strategy = AnyDDPStrategy() if args.devices > 1 else AnySingleDeviceStrategy()
    trainer = L.Trainer(
        accelerator=AnyAccelerator(),
        strategy=strategy,
        devices=args.devices,
        precision=args.precision,
        max_epochs=args.max_epochs,
        logger=False,
        enable_checkpointing=False,
    )
    model = DemoModel()
    trainer.fit(model, demo_loader(), demo_loader(seed=1))
    if trainer.is_global_zero:
        print(f"trained on {trainer.strategy.root_device} x {trainer.world_size},"
              f" final val_loss {float(trainer.callback_metrics['val_loss']):.4f}")


if __name__ == "__main__":
    main()
