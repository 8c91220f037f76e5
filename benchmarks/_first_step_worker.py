"""Time to first step of a 2-process ``AnyDDPStrategy`` fit (run by :mod:`benchmarks.first_step`).

The caller passes ``--t0``, the wall-clock time right before it started this interpreter. Rank 0
writes four wall-clock times (``time.time()``, one machine, so comparable across processes):
``t0``; ``imported`` (the launching process finished importing torch, Lightning and the
package); ``setup`` (the ``setup`` hook on rank 0: processes started and the process group
rendezvous done); ``first_step`` (the first optimizer step finished on rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer

from benchmarks.common import quiet_bench, synchronize
from benchmarks.models import OVERHEAD, BenchModule, make_loader, scaled
from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--start-method", required=True, choices=["popen", "spawn", "fork"])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--t0", type=float, required=True)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    # the launching process is done importing; popen ranks inherit the value, spawn/fork children too
    os.environ.setdefault("BENCH_T_IMPORTED", repr(time.time()))
    quiet_bench()
    torch.set_num_threads(1)
    w = scaled(OVERHEAD, args.scale)
    trainer = Trainer(
        accelerator=AnyAccelerator(), strategy=AnyDDPStrategy(start_method=args.start_method, timeout=timedelta(seconds=120)),
        devices=args.devices, max_steps=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[FirstStepReport(args.out, args.t0)], use_distributed_sampler=False,
    )
    trainer.fit(BenchModule(w), make_loader(w, 2))


class FirstStepReport(Callback):
    """Rank 0 writes the phase timestamps after its first training step."""

    def __init__(self, out: str, t0: float) -> None:
        self.out, self.t0 = out, t0
        self.setup_time: float | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.setup_time = time.time()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx != 0 or trainer.global_rank != 0:
            return
        synchronize(pl_module.device)
        Path(self.out).write_text(json.dumps({
            "t0": self.t0,
            "imported": float(os.environ["BENCH_T_IMPORTED"]),
            "setup": self.setup_time,
            "first_step": time.time(),
            "world_size": trainer.world_size,
            "device": str(pl_module.device),
        }))


if __name__ == "__main__":
    main()
