"""Train the digits CNN on 1 or more devices and nodes, on any accelerator.

Notebook 3 launches this script on one node, notebook 4 on several (they copy it next to them with
``lightning_anyaccel.kit.tutorial.copy_script("train_digits.py")``):

    python train_digits.py --devices 1
    python train_digits.py --devices 2        # DDP: the script runs again per process
    MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NODE_RANK=0 \
        python train_digits.py --devices 2 --num-nodes 2    # on each node

Every process prints one "[node N rank R]" line when training starts; global rank 0
writes the results (test accuracy, validation accuracy per epoch, throughput, batch sizes) as JSON to --out.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.kit.tools.local_runs import quiet_lightning  # no info lines
from lightning_anyaccel.kit.tutorial.digits import DigitsCNN, DigitsDataModule


class WhoAmI(Callback):
    """Each process says where it runs: node, ranks, device, backend, data share."""

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        env = getattr(trainer.strategy, "cluster_environment", None)
        backend = dist.get_backend() if dist.is_initialized() else "none (1 process)"
        rank = f"{trainer.global_rank}/{trainer.world_size}"
        where = f"node {trainer.node_rank} rank {rank}"
        line = (f"[{where}] local_rank={trainer.local_rank}"
                f" device={trainer.strategy.root_device} backend={backend}"
                f" environment={type(env).__name__ if env else None}"
                f" train_batches_per_epoch={trainer.num_training_batches}\n")
        sys.stdout.write(line)  # one write: the processes share the output, lines stay whole
        sys.stdout.flush()


class EpochTimer(Callback):
    """Training throughput per epoch: samples per second of this process and of all.

    The device is synchronised (torch.accelerator) before each clock reading, so
    queued device work counts in its own epoch. The first epoch includes the warm-up.
    """

    def __init__(self) -> None:
        self.samples_per_s: list[float] = []
        self.val_acc: list[tuple[int, float]] = []  # (optimizer steps so far, validation accuracy)
        self.local_samples_per_s: list[float] = []
        self.epoch_s: list[float] = []
        self._start, self._samples = 0.0, 0

    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type == trainer.strategy.root_device.type:
            torch.accelerator.synchronize()

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        self._start, self._samples = time.perf_counter(), 0

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._samples += len(batch[0])

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:  # val_acc is logged with sync_dist: the same on every process
            self.val_acc.append((trainer.global_step, float(trainer.callback_metrics["val_acc"])))

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        seconds = time.perf_counter() - self._start
        samples = torch.tensor(float(self._samples))
        total = trainer.strategy.reduce(samples, reduce_op="sum")  # all processes
        self.epoch_s.append(seconds)
        self.samples_per_s.append(float(total) / seconds)
        self.local_samples_per_s.append(self._samples / seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="processes per node")
    parser.add_argument("--num-nodes", "--num_nodes", dest="num_nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="batch per device")
    parser.add_argument("--base-lr", type=float, default=0.01, help="lr of 1 device")
    parser.add_argument("--no-lr-scaling", action="store_true")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="JSON file for the results (rank 0)")
    args = parser.parse_args()

    quiet_lightning()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    L.seed_everything(args.seed, verbose=False)

    world_size = args.devices * args.num_nodes
    # Linear scaling: the global batch grows with the world size, so does the lr.
    lr = args.base_lr if args.no_lr_scaling else args.base_lr * world_size
    timer = EpochTimer()
    trainer = L.Trainer(
        accelerator=AnyAccelerator(),
        strategy="any_ddp" if world_size > 1 else "any_single",
        devices=args.devices,
        num_nodes=args.num_nodes,
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WhoAmI(), timer],
    )
    model = DigitsCNN(lr=lr)
    data = DigitsDataModule(batch_size=args.batch_size, seed=args.seed)
    trainer.fit(model, data)
    val_acc = float(trainer.callback_metrics["val_acc"])
    test_acc = float(trainer.test(model, data, verbose=False)[0]["test_acc"])
    # every process's throughput in the last epoch, gathered to every process
    mine = torch.tensor([timer.local_samples_per_s[-1]],
                        device=trainer.strategy.root_device)
    per_rank = trainer.strategy.all_gather(mine).reshape(-1).tolist()
    if trainer.is_global_zero:
        results = {
            "device": str(trainer.strategy.root_device.type),
            "world_size": trainer.world_size,
            "num_nodes": args.num_nodes,
            "devices_per_node": args.devices,
            "per_device_batch": args.batch_size,
            "global_batch": args.batch_size * trainer.world_size,
            "lr": lr,
            "train_batches_per_epoch_per_process": trainer.num_training_batches,
            "epochs": args.epochs,
            "samples_per_s": timer.samples_per_s,
            "samples_per_s_per_rank": per_rank,
            "node_of_rank": [r // args.devices for r in range(trainer.world_size)],
            "epoch_s": timer.epoch_s,
            "val_acc": val_acc,
            "val_acc_by_step": timer.val_acc,
            "test_acc": test_acc,
        }
        print(f"[rank 0] test_acc={test_acc:.4f}, training throughput of all processes in the "
              f"last epoch: {timer.samples_per_s[-1]:.0f} samples/s", flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
