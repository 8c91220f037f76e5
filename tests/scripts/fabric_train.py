"""Train a small MLP with Lightning Fabric and the package; write what each rank saw to ``<out>/rank<N>.json``.

Run directly (popen DDP re-runs this script per rank; spawn re-imports it). The launching
process writes ``<out>/parent.json`` with what ``fabric.launch`` returned (rank 0's record).
Inside every training step the script itself asserts that autocast is on for the device type
with the expected dtype when a mixed precision was asked for.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning import Fabric
from torch.utils.data import DataLoader

import lightning_anyaccel  # noqa: F401  (registers the names)
from lightning_anyaccel.demo import demo_data

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of every parameter, to compare ranks and runs."""
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().cpu().float().numpy().tobytes())
    return h.hexdigest()


class Net(torch.nn.Module):
    """A two-layer MLP that records the autocast state inside its forward (i.e. inside the step)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.autocast_seen: list[tuple[str, bool, str]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.device.type
        self.autocast_seen.append((t, torch.is_autocast_enabled(t), str(torch.get_autocast_dtype(t))))
        return self.net(x)


def run(fabric: Fabric, args: argparse.Namespace) -> dict[str, Any]:
    fabric.seed_everything(1234)
    torch.set_num_threads(1)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(demo_data(), batch_size=16))
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": 0}
    loaded_digest = None
    if args.load:
        fabric.load(args.load, state)
        loaded_digest = weights_digest(model)
    device_type = fabric.device.type
    expected = AUTOCAST_DTYPES.get(args.precision)
    losses, step_autocast = [], []
    batches = iter(loader)
    for _ in range(args.steps):
        x, y = next(batches)
        optimizer.zero_grad()
        with fabric.autocast():  # the step body, as Fabric users write it
            enabled = torch.is_autocast_enabled(device_type)
            dtype = torch.get_autocast_dtype(device_type)
            if expected is not None:
                assert enabled, f"autocast is off for {device_type!r} inside the step"
                assert dtype == expected, f"autocast dtype {dtype}, expected {expected}"
            step_autocast.append([enabled, str(dtype)])
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        fabric.backward(loss)
        optimizer.step()
        state["step"] += 1
        losses.append(float(loss.detach()))
    rank = fabric.global_rank

    def mine() -> torch.Tensor:  # a fresh tensor per collective: Lightning's all_reduce works in place
        return torch.tensor(float(rank + 1), device=fabric.device)

    record = {
        "rank": rank,
        "world_size": fabric.world_size,
        "pid": os.getpid(),
        "strategy": type(fabric.strategy).__module__ + "." + type(fabric.strategy).__name__,
        "launcher": type(fabric.strategy.launcher).__name__ if fabric.strategy.launcher else None,
        "device": str(fabric.device),
        "param_device": str(next(model.parameters()).device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "precision": type(fabric.strategy.precision).__name__,
        "precision_device": getattr(fabric.strategy.precision, "device", None),
        "autocast_in_step": step_autocast,
        "autocast_in_forward": [list(t) for t in sorted(set(model.module.autocast_seen))],
        "step": state["step"],
        "losses": losses,
        "loaded_digest": loaded_digest,
        "all_reduce_sum": float(fabric.all_reduce(mine(), reduce_op="sum")),
        "all_reduce_mean": float(fabric.all_reduce(mine(), reduce_op="mean")),
        "all_gather": fabric.all_gather(torch.tensor([rank], device=fabric.device)).flatten().tolist(),
        "broadcast": fabric.broadcast({"token": f"from-rank-{rank}"}, src=0),
    }
    fabric.barrier()
    if args.save:
        fabric.save(args.save, state)
    record["weights"] = weights_digest(model)
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(record))
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="any")
    parser.add_argument("--strategy", default="any_ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save", default=None)
    parser.add_argument("--load", default=None)
    args = parser.parse_args(argv)
    fabric = Fabric(accelerator=args.accelerator, strategy=args.strategy, devices=args.devices,
                    precision=args.precision)
    result = fabric.launch(run, args)
    if fabric.global_rank == 0:
        Path(args.out, "parent.json").write_text(json.dumps({"pid": os.getpid(), "result": result}))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
