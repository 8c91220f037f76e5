"""One multi-process parity job: each ``STRATEGY[:CONTROL]`` of ``--strategy`` (comma-separated) trains ``--steps`` optimizer
steps in the same 2 processes, then rank 0 trains the serial one-device reference from the same weights and rows.

Every process writes ``<out>/<strategy>[-<control>].rank<R>.json`` (per step: global gradient norm before and after
clipping, every trainable tensor's full gradient before clipping and update; at the end every frozen tensor), rank 0 also
``<out>/reference.json``; ``lightning_anyaccel.tools.parity.compare`` judges them (``tests/test_parity.py``).
A ``CONTROL`` installs a fault the check must reject: ``drop_rank`` (rank 1's gradients left out: zeroed
before the all-reduce), ``sum`` (gradients summed instead of averaged), ``skip_update`` (rank 1 skips the
optimizer step), ``unsharded`` (FSDP2: a parameter that no ``fully_shard`` manages, so it is never averaged;
the strategy's own refusal of it switched off), ``unsharded_guard`` (the same, with the refusal in place).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning_anyaccel
from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.tools.parity import global_norm, serial_reference

WIDTH, GLOBAL_BATCH, LR, MAX_NORM = 6, 8, 0.5, 0.5


def rows(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(steps * GLOBAL_BATCH, WIDTH, generator=g)
    return x, (x[:, :1] * 3 - x[:, 1:2]).tanh() * 4  # large targets: the norm exceeds MAX_NORM, clipping acts


def build_net() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(WIDTH, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                              torch.nn.Linear(16, 1))
    net[0].requires_grad_(False)  # frozen: must stay bit-identical
    net.register_parameter("scale", torch.nn.Parameter(torch.ones(1)))
    return net


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = build_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) * self.net.scale


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu().clone()  # a copy, not a view


class ParityModule(L.LightningModule):
    def __init__(self, steps: int, control: str) -> None:
        super().__init__()
        self.model, self.steps, self.control = Net(), steps, control
        self.records: list[dict[str, Any]] = []
        self._old: dict[str, torch.Tensor] = {}

    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import fully_shard

        for layer in self.model.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh["data_parallel"])
        if not self.control.startswith("unsharded"):  # else `scale` stays outside every shard
            fully_shard(self.model, mesh=mesh["data_parallel"])

    def train_dataloader(self) -> DataLoader:
        x, y = rows(self.steps)
        per = GLOBAL_BATCH // self.trainer.world_size
        mine = torch.cat([torch.arange(s * GLOBAL_BATCH + self.global_rank * per, s * GLOBAL_BATCH
                                       + (self.global_rank + 1) * per) for s in range(self.steps)])
        return DataLoader(TensorDataset(x[mine], y[mine]), batch_size=per)

    def on_train_start(self) -> None:
        factor = {"drop_rank": 0.0 if self.global_rank == 1 else 1.0, "sum": float(self.trainer.world_size)}
        if self.control in factor:
            for p in self.trainable().values():
                p.register_hook(lambda g, f=factor[self.control]: g * f)

    def trainable(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.trainable().values(), lr=LR)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        params = self.trainable()
        grads = {n: full(p.grad) for n, p in params.items() if p.grad is not None}
        torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM)
        clipped = [full(p.grad) for p in params.values() if p.grad is not None]
        self.records.append({"norm_before": global_norm(grads.values()), "norm_after": global_norm(clipped),
                             "grads": {n: g.flatten().tolist() for n, g in grads.items()}})
        self._old = {n: full(p) for n, p in params.items()}
        if self.control == "skip_update" and self.global_rank == 1:
            for p in params.values():
                p.grad = None  # SGD leaves a parameter without a gradient as it is: this rank skips the update

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.records[-1]["update"] = {n: (full(p) - self._old[n]).flatten().tolist()
                                      for n, p in self.trainable().items()}

    def frozen(self) -> dict[str, list[float]]:
        return {n: full(p).flatten().tolist() for n, p in self.model.named_parameters() if not p.requires_grad}


def build_strategy(name: str) -> Any:
    if name == "ddp":
        return lightning_anyaccel.AnyDDPStrategy()
    if name == "fsdp2":
        return lightning_anyaccel.AnyModelParallelStrategy(tensor_parallel_size=1)
    raise ValueError(f"--strategy: ddp or fsdp2, not {name!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="ddp,fsdp2")
    parser.add_argument("--device-type", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    jobs = [(entry, *entry.partition(":")[::2]) for entry in args.strategy.split(",")]
    if any(control == "unsharded" for _, _, control in jobs):  # the strategy refuses this before fitting: switched off to show parity catches it too
        from lightning_anyaccel.strategies import model_parallel

        model_parallel.refuse_unsharded_parameters = lambda module, world_size: None  # type: ignore[assignment]
    torch.set_num_threads(1)
    out = Path(args.out)
    rank = 0
    for entry, name, control in jobs:
        module = ParityModule(args.steps, control or "none")
        trainer = L.Trainer(accelerator=AnyAccelerator(args.device_type), strategy=build_strategy(name),
                            devices=args.devices, max_steps=args.steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
        trainer.fit(module)
        rank = trainer.global_rank
        (out / f"{entry.replace(':', '-')}.rank{rank}.json").write_text(json.dumps({"steps": module.records, "frozen": module.frozen()}))
    if rank == 0:
        device = torch.device(args.device_type)
        x, y = rows(args.steps)
        model = Net().to(device)
        batches = [(x[i:i + GLOBAL_BATCH].to(device), y[i:i + GLOBAL_BATCH].to(device))
                   for i in range(0, len(x), GLOBAL_BATCH)]
        steps, frozen = serial_reference(model, batches, lr=LR, max_norm=MAX_NORM)
        (out / "reference.json").write_text(json.dumps({"steps": steps, "frozen": frozen}))


if __name__ == "__main__":
    main(sys.argv[1:])
