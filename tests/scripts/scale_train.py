"""Multi-node training script for the scale-out tests (and the launch scripts' example).

Trains :class:`~lightning_anyaccel.tools.demo.DemoModel` with ``AnyDDPStrategy`` on CPU and writes
``<out>/rank<N>.json`` (rank, world size, node rank, per-step losses, weights digest) and
``<out>/pid.<pid>`` files (so a test can prove no process outlived the job). Fault
injections (for the failure tests): ``--die-rank/--die-at-step`` (SIGKILL itself),
``--freeze-rank/--freeze-at-step`` (SIGSTOP itself), ``--hang-save-at`` (a checkpoint save
that stops halfway and waits to be killed), ``--io direct`` (a non-atomic writer, the control).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy
from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.tools.demo import DemoModel, demo_loader


class StepLog(Callback):
    """Records ``(global_step, loss)`` per step and writes one JSON file per rank at the end."""

    def __init__(self, out: Path) -> None:
        self.out = out
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


class Faults(Callback):
    """Kills or freezes one rank at a given step (what a crashed or hung node looks like)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        rank, step = trainer.global_rank, trainer.global_step
        if rank == self.args.die_rank and step == self.args.die_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == self.args.freeze_rank and step == self.args.freeze_at_step:
            os.kill(os.getpid(), signal.SIGSTOP)


class HangingSaveIO(AtomicCheckpointIO):
    """Writes half of the checkpoint of step ``hang_at``, signals ``marker`` and waits to be killed."""

    def __init__(self, hang_at: int, marker: Path) -> None:
        super().__init__()
        self.hang_at = hang_at
        self.marker = marker

    def _write(self, checkpoint: dict[str, Any], file: BinaryIO) -> None:
        if checkpoint.get("global_step") != self.hang_at:
            super()._write(checkpoint, file)
            return
        import io

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        data = buffer.getvalue()
        file.write(data[: len(data) // 2])
        file.flush()
        self.marker.write_text(str(file.name))
        while True:
            time.sleep(1)


class DirectHangingSaveIO(HangingSaveIO):
    """The control: writes straight into the target file, as a non-atomic writer would."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as file:
            self._write(checkpoint, file)


def build_trainer(args: argparse.Namespace, out: Path) -> L.Trainer:
    callbacks: list[Callback] = [StepLog(out), Faults(args)]
    io = None
    if args.hang_save_at is not None:
        kind = DirectHangingSaveIO if args.io == "direct" else HangingSaveIO
        io = kind(args.hang_save_at, out / "saving")
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_epochs=1))
    strategy = AnyDDPStrategy(
        timeout=timedelta(seconds=args.timeout) if args.timeout else None,
        checkpoint_io=io,
    )
    return L.Trainer(
        accelerator=AnyAccelerator("cpu"),
        strategy=strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=args.max_epochs,
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=bool(args.ckpt_dir),
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
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--die-rank", type=int, default=None)
    parser.add_argument("--die-at-step", type=int, default=None)
    parser.add_argument("--freeze-rank", type=int, default=None)
    parser.add_argument("--freeze-at-step", type=int, default=None)
    parser.add_argument("--hang-save-at", type=int, default=None)
    parser.add_argument("--io", choices=("atomic", "direct"), default="atomic")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"pid.{os.getpid()}").touch()
    L.seed_everything(1234, verbose=False)
    torch.set_num_threads(1)
    trainer = build_trainer(args, out)
    trainer.fit(DemoModel(), demo_loader(), ckpt_path=args.resume)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
