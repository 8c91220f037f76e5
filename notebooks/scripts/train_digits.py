"""Train the tutorial's digits CNN on 1 or more devices, on 1 or more nodes, on any accelerator.

Launched by the multi-card and multi-node notebooks and by the cluster scripts in
``scripts/launch/``; run it yourself the same way:

    python notebooks/scripts/train_digits.py --devices 1
    python notebooks/scripts/train_digits.py --devices 2                 # DDP, this script re-run per rank
    NODE_RANK=0 MASTER_ADDR=host0 MASTER_PORT=29500 \\
        python notebooks/scripts/train_digits.py --devices 2 --num-nodes 2   # on each node
    torchrun --nnodes 2 --nproc-per-node 2 ... notebooks/scripts/train_digits.py --devices 2 --num-nodes 2

Every process prints one ``[node N rank R]`` line when training starts; global rank 0 writes
the results (test accuracy, throughput, batch sizes) as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # notebooks/: the shared tutorial module
from tutorial import DigitsCNN, DigitsDataModule, EpochTimer, quiet_lightning  # noqa: E402

from lightning_anyaccel import AnyAccelerator  # noqa: E402


class WhoAmI(Callback):
    """Each process says where it runs: node, ranks, device, backend, its share of the data."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        env = getattr(trainer.strategy, "cluster_environment", None)
        backend = dist.get_backend() if dist.is_initialized() else "none (one process)"
        print(
            f"[node {trainer.node_rank} rank {trainer.global_rank}/{trainer.world_size}]"
            f" local_rank={trainer.local_rank} device={trainer.strategy.root_device} backend={backend}"
            f" environment={type(env).__name__ if env else None}"
            f" train_batches_per_epoch={trainer.num_training_batches}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="devices (processes) per node")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per-device batch size")
    parser.add_argument("--base-lr", type=float, default=0.01, help="learning rate for one device")
    parser.add_argument("--no-lr-scaling", action="store_true", help="keep --base-lr for any world size")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the results (global rank 0)")
    args = parser.parse_args(argv)

    quiet_lightning()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    L.seed_everything(args.seed, verbose=False)

    world_size = args.devices * args.num_nodes
    # Linear scaling: the global batch grows with the world size, so does the learning rate.
    lr = args.base_lr if args.no_lr_scaling else args.base_lr * world_size
    timer = EpochTimer()
    trainer = L.Trainer(
        accelerator=AnyAccelerator(),
        strategy="any_ddp" if world_size > 1 else "any_single",
        devices=args.devices,
        num_nodes=args.num_nodes,
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[WhoAmI(), timer],
    )
    model = DigitsCNN(lr=lr)
    data = DigitsDataModule(batch_size=args.batch_size, seed=args.seed)
    trainer.fit(model, data)
    val_acc = float(trainer.callback_metrics["val_acc"])
    test_acc = float(trainer.test(model, data, verbose=False)[0]["test_acc"])
    # every process's own throughput in the last epoch, gathered to every process (rank order)
    mine = torch.tensor([timer.local_samples_per_s[-1]], device=trainer.strategy.root_device)
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
            "node_of_rank": [rank // args.devices for rank in range(trainer.world_size)],
            "epoch_s": timer.epoch_s,
            "val_acc": val_acc,
            "test_acc": test_acc,
        }
        print(f"[rank 0] test_acc={test_acc:.4f} samples/s (last epoch)={timer.samples_per_s[-1]:.0f}", flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
