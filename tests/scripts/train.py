"""Train DemoModel with the Trainer and the package; each rank writes its record.

Run directly (popen DDP re-runs this script per rank) or imported by the tests (``main(argv)``).
``fabric_train.py`` is the same run written with Fabric: the same arguments and record
(``script_common.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).parent))
import script_common  # noqa: E402

import lightning_anyaccel  # noqa: E402,F401  (registers names)
from lightning_anyaccel import AnyAccelerator  # noqa: E402
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader  # noqa: E402


class Report(Callback):
    """Writes each rank's record at the end of fit."""

    def __init__(self, out: str, save: str | None) -> None:
        self.out, self.save = out, save
        self.start_weights: str | None = None
        self.start_losses = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:  # after a checkpoint was restored
        self.start_weights = script_common.weights_digest(pl_module)
        self.start_losses = len(pl_module.losses)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        strategy = trainer.strategy
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            **script_common.common(strategy, trainer.precision_plugin, pl_module),
            "autocast": [list(pair) for pair in sorted(set(pl_module.autocast_seen))],
            "step": trainer.global_step,
            "losses": pl_module.losses[self.start_losses:],
            "start_weights": self.start_weights,
            **script_common.collectives(trainer.global_rank, strategy.root_device,
                                      lambda t, op: strategy.reduce(t, reduce_op=op), strategy.all_gather,
                                      lambda obj: strategy.broadcast(obj, src=0)),
        }
        script_common.write(self.out, trainer.global_rank, record)
        if self.save:  # here, not after fit: the weights are still on the device (fit's teardown moves them)
            trainer.save_checkpoint(self.save)


def build_trainer(args: argparse.Namespace) -> L.Trainer:
    strategy: Any = args.strategy
    if strategy == "lightning:ddp_spawn":  # Lightning's own class, not its name (names map to the package's)
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(start_method="spawn")
    elif args.unnumbered and args.device_type != "cpu":  # lightning-habana's form: numbered by local rank
        # (CPU devices have no index, and Lightning refuses CPU parallel_devices with any accelerator but its own)
        from lightning_anyaccel import AnyDDPStrategy
        from lightning_anyaccel.strategies.families import START_METHODS

        strategy = AnyDDPStrategy(start_method=START_METHODS[strategy],
                                  parallel_devices=[torch.device(args.device_type)] * args.devices)
    return L.Trainer(
        accelerator=AnyAccelerator(args.device_type),
        strategy=strategy,
        devices=args.devices,
        precision=args.precision,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Report(args.out, args.save)],
    )


def main(argv: list[str] | None = None) -> None:
    args = script_common.parse(argv)
    L.seed_everything(1234, verbose=False)
    torch.set_num_threads(1)
    trainer = build_trainer(args)
    if args.touch_device:
        torch.ones(1, device=args.device_type)
    trainer.fit(DemoModel(), demo_loader(), ckpt_path=args.load)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
