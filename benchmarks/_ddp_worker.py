"""One DDP-scaling measurement: train a workload on N processes and write rank 0's steps/s as JSON.

Run by :mod:`benchmarks.ddp_scaling` as ``python -m benchmarks._ddp_worker ...``. With
``--devices 1`` it trains with ``any_single`` (no process group: the single-device baseline);
with more it uses ``AnyDDPStrategy`` and the ``popen`` launcher, which starts this module again
per extra rank. The device comes from ``AnyAccelerator()``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--measure", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from datetime import timedelta

    import torch
    from lightning.pytorch import Trainer

    from benchmarks.common import quiet_lightning
    from benchmarks.models import WORKLOADS, BenchModule, StepTimer, make_loader, scaled
    from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy

    quiet_lightning()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    w = scaled(WORKLOADS[args.workload], args.scale)
    steps = args.warmup + args.measure
    timer = StepTimer(args.warmup, args.measure)
    strategy = "any_single" if args.devices == 1 else AnyDDPStrategy(timeout=timedelta(seconds=120))
    trainer = Trainer(
        accelerator=AnyAccelerator(), strategy=strategy, devices=args.devices, max_steps=steps, max_epochs=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[timer], use_distributed_sampler=False,
    )
    # every rank reads its own, different batches (weak scaling: per-process batch fixed)
    trainer.fit(BenchModule(w), make_loader(w, steps, seed=int(os.environ.get("LOCAL_RANK", "0"))))
    if trainer.global_rank == 0:
        import torch.distributed as dist

        Path(args.out).write_text(json.dumps({
            "steps_per_s": timer.steps_per_s,
            "world_size": trainer.world_size,
            "device": str(trainer.strategy.root_device),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "strategy": type(trainer.strategy).__name__,
        }))


if __name__ == "__main__":
    main()
