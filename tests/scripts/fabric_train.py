"""Train a small MLP with Lightning Fabric and the package; each rank writes its record.

Run directly (popen DDP re-runs this script per rank; spawn re-imports it) or imported by the tests
(``main(argv)``). ``train.py`` is the same run written with the Trainer: the same arguments and
record (``script_common.py``). The launching process writes ``<out>/parent.json`` with what
``fabric.launch`` returned (rank 0's record). Inside every training step the script itself asserts
that autocast is on for the device type with the expected dtype when a mixed precision was asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from lightning import Fabric
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import script_common  # noqa: E402

import lightning_anyaccel  # noqa: E402,F401  (registers the names)
from lightning_anyaccel import AnyAccelerator  # noqa: E402
from lightning_anyaccel.kit.tools.demo import demo_data  # noqa: E402

AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


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
    if args.load:
        fabric.load(args.load, state)
    start_weights = script_common.weights_digest(model)
    device_type = fabric.device.type
    expected = AUTOCAST_DTYPES.get(args.precision)
    losses, step_autocast = [], []
    batches = iter(loader)
    while state["step"] < args.steps:
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
    seen = sorted(set(model.module.autocast_seen))
    record = {
        "rank": rank,
        "world_size": fabric.world_size,
        **script_common.common(fabric.strategy, fabric.strategy.precision, model),
        "precision": type(fabric.strategy.precision).__name__,
        "autocast": [[t, dtype.replace("torch.", "")] for t, on, dtype in seen if on],
        "autocast_in_step": step_autocast,
        "autocast_in_forward": [list(t) for t in seen],
        "step": state["step"],
        "losses": losses,
        "start_weights": start_weights,
        **script_common.collectives(rank, fabric.device, lambda t, op: fabric.all_reduce(t, reduce_op=op),
                                    fabric.all_gather, lambda obj: fabric.broadcast(obj, src=0)),
    }
    fabric.barrier()
    if args.save:
        fabric.save(args.save, state)
    script_common.write(args.out, rank, record)
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = script_common.parse(argv)
    fabric = Fabric(accelerator=AnyAccelerator(args.device_type), strategy=args.strategy, devices=args.devices,
                    precision=args.precision)
    if args.touch_device:
        torch.ones(1, device=args.device_type)
    result = fabric.launch(run, args)
    if fabric.global_rank == 0:
        Path(args.out, "parent.json").write_text(json.dumps({"pid": os.getpid(), "result": result}))
    return result


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
