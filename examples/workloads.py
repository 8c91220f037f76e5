"""Real workloads through the package: a Hugging Face GPT-2 and a CNN with BatchNorm, several configurations in one job.

Used by ``tests/test_workloads.py`` (on CPU and on every ``--device``). One launch trains every
configuration, so the job pays for two interpreters and one process group, not one pair per case::

    python examples/workloads.py --device cpu --out /tmp/workloads

Configurations (``--configs``, comma-separated; all by default):

- ``gpt2_single``: one device, bf16-mixed, clipping by norm, gradient accumulation 2, AdamW with a
  cosine schedule, Hugging Face gradient checkpointing (rank 0 only, before the others start);
- ``gpt2_ddp``: 2 processes, bf16-mixed, clipping by value, ``torch.utils.checkpoint`` around each
  block (with dropout), the loss logged with ``sync_dist=True``; writes a checkpoint;
- ``gpt2_fsdp``: FSDP with GPT-2 blocks auto-wrapped and activation-checkpointed, bf16-mixed,
  clipping by norm (``FullyShardedDataParallel.clip_grad_norm_``);
- ``gpt2_fsdp2``: ``fully_shard`` per block in ``configure_model``, bf16-mixed, clipping by norm;
- ``cnn_syncbn``: the CNN with ``sync_batchnorm=True`` (torch's SyncBatchNorm where the device has
  its kernels, the package's ``DeviceSyncBatchNorm`` elsewhere), compiled with
  ``lightning_anyaccel.compile(backend="aot_eager")``;
- ``syncbn_numerics``: the package's synchronized BatchNorm against BatchNorm on the full batch
  (outputs, gradients, running statistics);
- ``gpt2_deepspeed``: DeepSpeed ZeRO-2 (where DeepSpeed runs on the device);
- ``resume``: rank 0 alone resumes ``gpt2_ddp``'s checkpoint on CPU (another device type unless
  the job runs on CPU, and another world size) and trains two more steps.

Every rank writes ``<out>/rank<N>.json``: per configuration the losses, the device types seen
inside ``training_step``, a digest of the weights, the synced metric and what was clipped.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

import lightning_anyaccel  # noqa: E402,F401  (registers names)
from lightning_anyaccel import AnyFSDPStrategy  # noqa: E402

CONFIGS = ("gpt2_single", "gpt2_ddp", "gpt2_fsdp", "gpt2_fsdp2", "cnn_syncbn", "syncbn_numerics", "gpt2_deepspeed",
           "resume")
#: The configurations that run in every process (the others run in rank 0 only).
MULTI_PROCESS = ("gpt2_ddp", "gpt2_fsdp", "gpt2_fsdp2", "cnn_syncbn", "syncbn_numerics", "gpt2_deepspeed")


# ----- data -----------------------------------------------------------------------------------


def corpus() -> str:
    """A text every Python has: the Zen of Python (``import this``), ROT13-decoded."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # the first import prints it
        import this
    return codecs.decode(this.s, "rot13")


class ByteBlocks(Dataset):
    """Byte-level tokens of ``text`` (vocabulary 256) in overlapping blocks of ``block`` tokens."""

    def __init__(self, text: str, block: int = 32, stride: int = 16) -> None:
        self.tokens = torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
        self.block, self.stride = block, stride

    def __len__(self) -> int:
        return (len(self.tokens) - self.block) // self.stride

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i * self.stride: i * self.stride + self.block]


def image_data(n: int = 256, seed: int = 0) -> TensorDataset:
    """``n`` 1x12x12 images of 4 classes: a fixed random pattern per class plus noise."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(4, 1, 12, 12, generator=g)
    labels = torch.arange(n) % 4
    return TensorDataset(patterns[labels] + 0.8 * torch.randn(n, 1, 12, 12, generator=g), labels)


# ----- models ---------------------------------------------------------------------------------


def gpt2_config(**overrides: Any) -> Any:
    """A tiny GPT-2 configuration (2 blocks, width 64, byte vocabulary): nothing is downloaded."""
    from transformers import GPT2Config

    settings = dict(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                    eos_token_id=0, resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    return GPT2Config(**{**settings, **overrides})


class Steps(L.LightningModule):
    """What every workload records: per-step losses, device types inside the step, clipping seen."""

    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []
        self.seen_devices: set[str] = set()
        self.grad_norms: list[float] = []
        self.clipped: list[tuple[float, float]] = []

    def _record(self, loss: torch.Tensor, batch: torch.Tensor) -> None:
        self.losses.append(float(loss.detach().float()))
        self.seen_devices.add(batch.device.type)
        self.seen_devices.add(next(self.parameters()).device.type)
        self.log("train_loss", loss, sync_dist=True, prog_bar=False)

    #: Whether each rank holds only part of the gradients (FSDP, FSDP2): statistics are reduced over ranks.
    sharded_grads = False

    def grad_stats(self) -> tuple[float, float]:
        """(total norm, largest absolute value) of all gradients, over every rank's shard when sharded.

        FSDP2's gradients are DTensors, which reduce over the mesh themselves; FSDP's are local
        shards of plain tensors, reduced here (:attr:`sharded_grads`).
        """
        import torch.distributed as dist

        grads = [p.grad.detach() for p in self.parameters() if p.grad is not None]
        if not grads:
            return 0.0, 0.0
        if hasattr(grads[0], "full_tensor"):  # DTensor
            norm = torch.nn.utils.get_total_norm(grads).full_tensor()
            largest = torch.nn.utils.get_total_norm(grads, norm_type=float("inf")).full_tensor()
            return float(norm), float(largest)
        squares = sum((g.float() * g.float()).sum() for g in grads if g.numel())
        largest = torch.stack([g.float().abs().max() for g in grads if g.numel()]).max()
        if self.sharded_grads and dist.is_initialized():
            dist.all_reduce(squares)
            dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return float(squares.sqrt()), float(largest)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's default (``self.clip_gradients``), with the gradient statistics before and after it."""
        self.grad_norms.append(self.grad_stats()[0])
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)
        self.clipped.append(self.grad_stats())


class Checkpointed(torch.nn.Module):
    """``torch.utils.checkpoint`` around a module: its activations are recomputed in the backward pass."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.module, *args, use_reentrant=False, **kwargs)


class GPT2Module(Steps):
    """A Hugging Face ``GPT2LMHeadModel`` from :func:`gpt2_config`, AdamW with warm-up and cosine decay.

    Args:
        checkpointing: ``"hf"`` (``gradient_checkpointing_enable``), ``"torch"``
            (``torch.utils.checkpoint`` around each block, here) or ``None``.
        fully_shard: apply FSDP2's ``fully_shard`` to each block and the model (``configure_model``).
        lr, total_steps: AdamW's learning rate and the schedule's length (optimizer steps).
    """

    def __init__(self, checkpointing: str | None = None, fully_shard: bool = False, lr: float = 3e-3,
                 total_steps: int = 12) -> None:
        super().__init__()
        self.save_hyperparameters()
        from transformers import GPT2LMHeadModel

        torch.manual_seed(0)
        self.model = GPT2LMHeadModel(gpt2_config())
        if checkpointing == "hf":
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif checkpointing == "torch":
            blocks = self.model.transformer.h
            for i, block in enumerate(blocks):
                blocks[i] = Checkpointed(block)

    def configure_model(self) -> None:
        if self.hparams.fully_shard:
            from torch.distributed.fsdp import fully_shard

            for block in self.model.transformer.h:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.model, mesh=self.device_mesh["data_parallel"])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=ids).loss

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self(batch)
        self._record(loss, batch)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        total, warmup = self.hparams.total_steps, max(1, self.hparams.total_steps // 10)

        def factor(step: int) -> float:  # linear warm-up, then cosine decay to 10 %
            if step < warmup:
                return (step + 1) / warmup
            return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class CNN(Steps):
    """Two convolutions with BatchNorm and a linear classifier (4 classes, 12x12 images)."""

    def __init__(self, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.norm_layers: list[str] = []
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if not self.norm_layers:  # what sync_batchnorm=True made of the BatchNorm layers, while training
            self.norm_layers = [type(m).__name__ for m in self.modules() if "BatchNorm" in type(m).__name__]
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self._record(loss, x)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


# ----- helpers --------------------------------------------------------------------------------


def digest(module: torch.nn.Module) -> str:
    """A digest of every parameter and buffer (equal on DDP ranks that hold the same weights)."""
    h = hashlib.sha1()
    for name, tensor in sorted(module.state_dict().items()):
        if isinstance(tensor, torch.Tensor):
            h.update(name.encode())
            h.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def trainer(device: str, devices: int, **kwargs: Any) -> L.Trainer:
    """A Trainer on the package's accelerator for ``device`` (its generic path, also on CPU)."""
    from lightning_anyaccel import AnyAccelerator

    return L.Trainer(accelerator=AnyAccelerator(device), devices=devices, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, **kwargs)


def summary(module: Steps, fit: L.Trainer, **extra: Any) -> dict[str, Any]:
    metric = fit.callback_metrics.get("train_loss")
    return {
        "losses": module.losses,
        "devices": sorted(module.seen_devices),
        "global_step": fit.global_step,
        "synced_loss": None if metric is None else float(metric),
        "grad_norms": module.grad_norms,
        "clipped_norms": [c[0] for c in module.clipped],
        "clipped_max_abs": [c[1] for c in module.clipped],
        "lr_last": float(fit.optimizers[0].param_groups[0]["lr"]) if fit.optimizers else None,
        **extra,
    }


def text_loader(batch_size: int = 8) -> DataLoader:
    return DataLoader(ByteBlocks(corpus()), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(0), drop_last=True)


# ----- configurations -------------------------------------------------------------------------


def gpt2_single(device: str, out: Path) -> dict[str, Any]:
    module = GPT2Module(checkpointing="hf", total_steps=10)
    fit = trainer(device, 1, precision="bf16-mixed", max_steps=10, accumulate_grad_batches=2,
                  gradient_clip_val=1.0, gradient_clip_algorithm="norm")
    fit.fit(module, text_loader())
    return summary(module, fit, weights=digest(module))


def gpt2_ddp(device: str, out: Path) -> dict[str, Any]:
    module = GPT2Module(checkpointing="torch", total_steps=10)
    fit = trainer(device, 2, strategy="any_ddp", precision="bf16-mixed", max_steps=10,
                  gradient_clip_val=0.05, gradient_clip_algorithm="value")
    fit.fit(module, text_loader())
    fit.save_checkpoint(out / "gpt2_ddp.ckpt")
    return summary(module, fit, weights=digest(module))


def gpt2_fsdp(device: str, out: Path) -> dict[str, Any]:
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    module = GPT2Module(total_steps=10)
    module.sharded_grads = True
    strategy = AnyFSDPStrategy(auto_wrap_policy={GPT2Block}, activation_checkpointing_policy={GPT2Block})
    fit = trainer(device, 2, strategy=strategy, precision="bf16-mixed", max_steps=10, gradient_clip_val=1.0)
    fit.fit(module, text_loader())
    wrapped = sum(type(m).__name__ == "FullyShardedDataParallel" for m in fit.strategy.model.modules())
    return summary(module, fit, fsdp_units=wrapped)


def gpt2_fsdp2(device: str, out: Path) -> dict[str, Any]:
    module = GPT2Module(fully_shard=True, total_steps=10)
    module.sharded_grads = True
    fit = trainer(device, 2, strategy="any_fsdp2", precision="bf16-mixed", max_steps=10, gradient_clip_val=1.0)
    fit.fit(module, text_loader())
    sharded = sum(type(p).__name__ == "DTensor" for p in module.parameters())
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in module.parameters())
    total = sum(p.numel() for p in module.parameters())
    return summary(module, fit, dtensor_params=sharded, local_fraction=local / total)


def gpt2_deepspeed(device: str, out: Path) -> dict[str, Any]:
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.strategies.support import deepspeed_support

    support = deepspeed_support(get_spec(device))
    if not support.supported:
        return {"skipped": f"DeepSpeed does not run on {device!r} here: {support.reason}"}
    module = GPT2Module(total_steps=10)
    fit = trainer(device, 2, strategy="any_deepspeed_stage_2", max_steps=10, gradient_clip_val=1.0)
    fit.fit(module, text_loader())
    return summary(module, fit)


def cnn_syncbn(device: str, out: Path) -> dict[str, Any]:
    module = CNN()
    module.net = lightning_anyaccel.compile(module.net, device_type=device, backend="aot_eager")
    loader = DataLoader(image_data(), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    fit = trainer(device, 2, strategy="any_ddp", max_steps=16, sync_batchnorm=True)
    fit.fit(module, loader)
    norm = next(m for m in fit.lightning_module.modules() if "BatchNorm" in type(m).__name__)
    return summary(module, fit, weights=digest(fit.lightning_module), batchnorm_layers=module.norm_layers,
                   running_var_moved=float((norm.running_var - 1).abs().max()))


def syncbn_numerics(device: str, out: Path) -> dict[str, Any]:
    """The package's synchronized BatchNorm on this rank's half of a batch against BatchNorm on all of it."""
    import torch.distributed as dist

    from lightning_anyaccel.device.sync_batchnorm import convert_sync_batchnorm

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    x = torch.randn(8, 3, 6, 6) * 3 + 1
    # no convolution bias: BatchNorm cancels it, so its gradient is zero up to rounding
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4)).double()
    synced = convert_sync_batchnorm(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4)))
    synced.load_state_dict(reference.state_dict())
    synced = synced.double().to(device)
    full = x.double().requires_grad_()
    expected = reference(full)
    (expected ** 3).sum().backward()
    part = x.double()[rank * 8 // world:(rank + 1) * 8 // world].to(device).requires_grad_()
    got = synced(part)
    (got ** 3).sum().backward()
    for p in synced.parameters():
        dist.all_reduce(p.grad)
    rel = lambda a, b: float((a.cpu() - b).abs().max() / b.abs().max().clamp(min=1e-12))  # noqa: E731
    return {
        "layer": type(synced[1]).__name__,
        "output": rel(got.detach(), expected.detach()[rank * 8 // world:(rank + 1) * 8 // world]),
        "input_grad": rel(part.grad, full.grad[rank * 8 // world:(rank + 1) * 8 // world]),
        "param_grads": max(rel(a.grad, b.grad) for a, b in zip(synced.parameters(), reference.parameters())),
        "running_mean": rel(synced[1].running_mean, reference[1].running_mean),
        "running_var": rel(synced[1].running_var, reference[1].running_var),
    }


def resume(device: str, out: Path) -> dict[str, Any]:
    """``gpt2_ddp``'s checkpoint (2 processes on ``device``) resumed on CPU by one process for 2 more steps."""
    ckpt = torch.load(out / "gpt2_ddp.ckpt", map_location="cpu", weights_only=False)
    module = GPT2Module(checkpointing="torch", total_steps=10)
    fit = trainer("cpu", 1, precision="bf16-mixed", max_steps=12, gradient_clip_val=0.05,
                  gradient_clip_algorithm="value")
    fit.fit(module, text_loader(), ckpt_path=str(out / "gpt2_ddp.ckpt"))
    return summary(module, fit, resumed_from_step=ckpt["global_step"], resumed_on="cpu", world_size=fit.world_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="device type to train on (cpu, cuda, xpu, npu, ...)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    args.out.mkdir(parents=True, exist_ok=True)
    worker = "LOCAL_RANK" in os.environ and os.environ["LOCAL_RANK"] != "0"  # started by the popen launcher
    results: dict[str, Any] = {}
    for name in args.configs.split(","):
        if worker and name not in MULTI_PROCESS:
            continue
        if name == "syncbn_numerics":
            import torch.distributed as dist

            if not dist.is_initialized():  # needs the process group of a multi-process fit before it
                continue
        start = time.monotonic()
        results[name] = globals()[name](args.device, args.out)
        results[name]["seconds"] = round(time.monotonic() - start, 1)
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    (args.out / f"rank{rank}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
