"""Multi-node training script for the scale-out launch tests (and the launch scripts' example).

Trains :class:`~lightning_anyaccel.kit.tools.demo.DemoModel` with ``AnyDDPStrategy`` on CPU and writes
``<out>/rank<N>.json`` (rank, world size, node rank, per-step losses, weights digest) and
``<out>/pid.<pid>`` files (so a test can prove no process outlived the job). With ``--stall-rank N``
that rank hangs after writing its file while the others wait for it in a barrier: the stall watchdog
(``--stall-timeout``) ends the job with every rank's stack. The fault tests
(``tests/test_faults.py``) use ``fault_train.py`` instead, on one node or several.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader


class StepLog(Callback):
    """Records ``(global_step, loss)`` per step and writes one JSON file per rank at the end."""

    def __init__(self, out: Path, stall_rank: int | None = None) -> None:
        self.out = out
        self.stall_rank = stall_rank
        self.losses: dict[int, float] = {}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses[trainer.global_step - 1] = float(outputs["loss"])

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        strategy = trainer.strategy
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "environment": type(strategy.cluster_environment).__name__,
            "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "global_step": trainer.global_step,
            "losses": self.losses,
            "weights": [float(p.detach().sum()) for p in pl_module.parameters()],
        }
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
        if self.stall_rank is None:
            return
        while trainer.global_rank == self.stall_rank:  # a hang outside collectives, after training
            time.sleep(0.5)
        strategy.barrier()


def build_trainer(args: argparse.Namespace, out: Path) -> L.Trainer:
    callbacks: list[Callback] = [StepLog(out, args.stall_rank)]
    strategy = AnyDDPStrategy(timeout=timedelta(seconds=args.timeout) if args.timeout else None,
                              stall_timeout=args.stall_timeout)
    return L.Trainer(
        accelerator=AnyAccelerator("cpu"),
        strategy=strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.max_epochs,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--max-epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--timeout", type=float, default=None, help="seconds; default: the strategy's")
    parser.add_argument("--out", default=os.environ.get("SCALE_OUT", "scale_out"))
    parser.add_argument("--stall-rank", type=int, default=None, help="this rank hangs after training")
    parser.add_argument("--stall-timeout", type=float, default=None, help="seconds; default: the environment's")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid.{os.getpid()}").touch()
    L.seed_everything(1234, verbose=False)
    torch.set_num_threads(1)
    trainer = build_trainer(args, out)
    trainer.fit(DemoModel(), demo_loader())


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
