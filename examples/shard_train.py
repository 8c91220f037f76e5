"""Train a wide MLP with DDP, FSDP, FSDP2 or DeepSpeed and write what each rank held to ``<out>/rank<N>.json``.

Used by the tests (``tests/test_sharding_cpu.py``) and by ``docs/memory_table.py``. Example::

    python examples/shard_train.py --strategy fsdp --devices 2 --out /tmp/run

``--strategy``: ``ddp``, ``fsdp`` (full checkpoints), ``fsdp_sharded``, ``fsdp2`` (distributed
checkpoints), ``fsdp2_full``, ``deepspeed_1``, ``deepspeed_2``, ``deepspeed_3``,
``deepspeed_2_offload``. Every rank records its losses, how many parameter and optimizer-state
elements it holds, and its peak live memory (sampled at every step boundary) above what it held
just before the model was built. On CPU that is host memory in use (glibc ``mallinfo2``), not RSS:
the allocator keeps freed pages, so RSS shows FSDP's unsharded start-up copy forever.

``--ckpt-dir DIR --resume-steps N`` then resumes, in the same processes, as a restarted job would:
a new model and a new Trainer continue from ``DIR/last.ckpt`` up to ``N`` steps and write
``<out>/resumed/rank<N>.json`` (one job instead of two process launches: the tests run many).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import psutil
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDDPStrategy,
    AnyDeepSpeedStrategy,
    AnyFSDPStrategy,
    AnyModelParallelStrategy,
    runtime,
)

STRATEGIES = ("ddp", "fsdp", "fsdp_sharded", "fsdp2", "fsdp2_full", "deepspeed_1", "deepspeed_2", "deepspeed_3",
              "deepspeed_2_offload")


class WideMLP(L.LightningModule):
    """``depth`` square ``Linear(width, width)`` layers; shards per layer under FSDP2 (``configure_model``)."""

    def __init__(self, width: int = 256, depth: int = 4, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers: list[torch.nn.Module] = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
        self.losses: list[float] = []

    @property
    def total_numel(self) -> int:
        """Parameter count of the whole (unsharded) model."""
        w, d = self.hparams.width, self.hparams.depth
        return d * (w * w + w) + w + 1

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None:
            return  # FSDP1 wraps by policy, DeepSpeed partitions itself
        from torch.distributed.fsdp import fully_shard

        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh["data_parallel"])
        fully_shard(self.net, mesh=mesh["data_parallel"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def wide_loader(width: int, batches_per_rank: int = 3, ranks: int = 2, batch_size: int = 16) -> DataLoader:
    """A fixed regression data set: each of ``ranks`` processes sees ``batches_per_rank`` batches per epoch."""
    generator = torch.Generator().manual_seed(0)
    n = batches_per_rank * ranks * batch_size
    x = torch.randn(n, width, generator=generator)
    y = x[:, :1] - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def build_strategy(name: str) -> Any:
    """The package strategy for a short ``name`` (see the module docstring)."""
    if name == "ddp":
        return AnyDDPStrategy()
    if name in ("fsdp", "fsdp_sharded"):
        return AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear},
                               state_dict_type="sharded" if name == "fsdp_sharded" else "full")
    if name in ("fsdp2", "fsdp2_full"):
        return AnyModelParallelStrategy(tensor_parallel_size=1, save_distributed_checkpoint=name == "fsdp2")
    if name.startswith("deepspeed_"):
        stage = int(name.split("_")[1])
        # Lightning's default buckets hold 2e8 elements each (800 MB in fp32) whatever the model size;
        # size them to the model, or they dwarf what ZeRO saves on a small one
        buckets = 2_000_000
        strategy = AnyDeepSpeedStrategy(stage=stage, offload_optimizer=name.endswith("offload"),
                                        reduce_bucket_size=buckets, allgather_bucket_size=buckets,
                                        sub_group_size=buckets)
        # a torch optimizer with ZeRO-Offload: no DeepSpeedCPUAdam to compile (slow on small machines)
        strategy.config["zero_force_ds_cpu_optimizer"] = False
        return strategy
    raise ValueError(f"--strategy must be one of {STRATEGIES}, not {name!r}")


def local_numel(tensor: torch.Tensor) -> int:
    """Elements of ``tensor`` that live in this process (a shard under FSDP2 / DeepSpeed ZeRO-3)."""
    if hasattr(tensor, "ds_tensor"):
        return tensor.ds_tensor.numel()
    if hasattr(tensor, "to_local"):
        return tensor.to_local().numel()
    return tensor.numel()


def optimizer_state_numel(optimizer: Any) -> int:
    """Elements of optimizer state (Adam moments) this process holds, through DeepSpeed's wrappers."""
    while not isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, "optimizer"):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return sum(local_numel(v) for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def live_host_bytes() -> int:
    """Bytes the process has allocated and not freed (glibc ``mallinfo2``: heap in use + mmapped chunks).

    Unlike RSS this drops when tensors are freed, so it shows what a rank holds, not what the
    allocator kept. Falls back to RSS where glibc is not there.
    """
    try:
        info = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return psutil.Process().memory_info().rss
    info.restype = _MallInfo2
    result = info()
    return int(result.uordblks + result.hblkhd)


def live_device_bytes(device: torch.device) -> int:
    """Bytes allocated on ``device`` (host bytes on CPU, where the model lives in host memory)."""
    if device.type == "cpu":
        return live_host_bytes()
    # the package's memory statistics: torch.accelerator's where this torch has them (2.9 and newer),
    # the device module's otherwise
    return int(runtime.memory_stats(device)["allocated_bytes.all.current"])


class Report(Callback):
    """Samples live memory at every step boundary; writes one JSON file per rank at the end of fit."""

    def __init__(self, out: str, before: int) -> None:
        self.out = out
        self.before = before
        self.peak = before

    def _sample(self, trainer: L.Trainer) -> None:
        self.peak = max(self.peak, live_device_bytes(trainer.strategy.root_device))

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._sample(trainer)

    def on_after_backward(self, trainer: L.Trainer, *args: Any) -> None:
        self._sample(trainer)

    def on_before_optimizer_step(self, trainer: L.Trainer, *args: Any) -> None:
        self._sample(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._sample(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: WideMLP) -> None:
        record = {
            "rank": trainer.global_rank,
            "strategy": type(trainer.strategy).__name__,
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "global_step": trainer.global_step,
            "losses": pl_module.losses,
            "total_numel": pl_module.total_numel,
            "param_numel": sum(local_numel(p) for p in trainer.strategy.model.parameters()),
            "param_device": str(next(trainer.strategy.model.parameters()).device),
            "optimizer_state_numel": optimizer_state_numel(trainer.optimizers[0]),
            "peak_mib": (self.peak - self.before) / 2**20,
        }
        Path(self.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=STRATEGIES, default="fsdp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--device-type", default=None)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--resume-steps", type=int, default=None,
                        help="then continue from <ckpt-dir>/last.ckpt to this many steps in the same processes")
    args = parser.parse_args(argv)
    if args.resume_steps is not None and not args.ckpt_dir:
        parser.error("--resume-steps resumes from the checkpoint of --ckpt-dir: give --ckpt-dir too")
    torch.set_num_threads(1)
    fit(args, args.out, args.max_steps, resume=args.resume, ckpt_dir=args.ckpt_dir)
    if args.resume_steps is not None:
        resumed = Path(args.out, "resumed")
        resumed.mkdir(parents=True, exist_ok=True)
        fit(args, str(resumed), args.resume_steps, resume=str(Path(args.ckpt_dir, "last.ckpt")), ckpt_dir=None)


def fit(args: argparse.Namespace, out: str, max_steps: int, resume: str | None, ckpt_dir: str | None) -> None:
    """One fit of a freshly built model and Trainer (a restarted job builds both anew as well)."""
    L.seed_everything(1234, verbose=False)
    before = live_host_bytes()
    model = WideMLP(args.width, args.depth)
    callbacks: list[Callback] = [Report(out, before)]
    if ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, every_n_epochs=1))
    trainer = L.Trainer(
        accelerator=AnyAccelerator(args.device_type),
        strategy=build_strategy(args.strategy),
        devices=args.devices,
        precision=args.precision,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=len(callbacks) > 1,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model, wide_loader(args.width, ranks=args.devices), ckpt_path=resume)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
