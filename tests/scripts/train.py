"""Train DemoModel with the package and write what each rank saw to ``<out>/rank<N>.json``.

Run directly (popen DDP re-runs this script per rank) or imported by the tests (spawn/fork).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.demo import DemoModel, demo_loader


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of every parameter, to compare ranks."""
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().cpu().float().numpy().tobytes())
    return h.hexdigest()


class Report(Callback):
    """Writes one JSON file per rank at the end of fit."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        import torch.distributed as dist

        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "strategy": type(trainer.strategy).__name__,
            "device": str(trainer.strategy.root_device),
            "param_device": str(next(pl_module.parameters()).device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "precision_device": getattr(trainer.precision_plugin, "device", None),
            "autocast_seen": sorted(set(map(tuple, pl_module.autocast_seen))),
            "weights": weights_digest(pl_module),
            "losses": pl_module.losses,
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def build_trainer(args: argparse.Namespace) -> L.Trainer:
    callbacks: list[Callback] = [Report(args.out)]
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_train_steps=1))
    strategy: Any = args.strategy
    if strategy == "lightning:ddp_spawn":  # Lightning's own class, not its name (names map to the package's)
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(start_method="spawn")
    elif args.unnumbered and args.device_type != "cpu":  # lightning-habana's form: numbered by local rank
        # (CPU devices have no index, and Lightning refuses CPU parallel_devices with any accelerator but its own)
        from lightning_anyaccel import AnyDDPStrategy
        from lightning_anyaccel.strategies.common import START_METHODS

        strategy = AnyDDPStrategy(start_method=START_METHODS[strategy],
                                  parallel_devices=[torch.device(args.device_type)] * args.devices)
    return L.Trainer(
        accelerator=AnyAccelerator(args.device_type),
        strategy=strategy,
        devices=args.devices,
        precision=args.precision,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=bool(args.ckpt_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="any_ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--device-type", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--unnumbered", action="store_true",
                        help="AnyDDPStrategy(parallel_devices=[torch.device(TYPE)] * DEVICES) with the --strategy's start"
                        " method (not on CPU)")
    parser.add_argument("--touch-device", action="store_true",
                        help="allocate a tensor on the device before fit (initialises it in this process)")
    args = parser.parse_args(argv)
    L.seed_everything(1234, verbose=False)
    torch.set_num_threads(1)
    trainer = build_trainer(args)
    if args.touch_device:
        torch.ones(1, device=args.device_type)
    trainer.fit(DemoModel(), demo_loader(), ckpt_path=args.resume)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
