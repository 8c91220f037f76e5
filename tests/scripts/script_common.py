"""What the tests' two training scripts share: their arguments, and the record each rank writes.

``train.py`` (Trainer, ``DemoModel``) and ``fabric_train.py`` (Fabric, the same two-layer MLP written
as a plain module) train on the demo data, take the same arguments (:func:`parse`) and write one record per rank to ``<out>/rank<N>.json``
(:func:`write`); ``tests/test_trainer_cpu.py`` checks a run of either with the same assertions.
The record's common fields:

- ``rank``, ``world_size``, ``pid``, ``strategy`` (class name), ``strategy_module``, ``launcher``;
- ``device`` (the strategy's root device), ``param_device``, ``backend`` (``None`` without a process
  group), ``precision_device`` (the precision plugin's device type, ``None`` for plain 32-bit);
- ``autocast``: the ``[device type, dtype]`` pairs autocast was on with inside the training steps;
- ``step`` (optimizer steps done), ``losses`` (of this run), ``start_weights`` and ``weights``
  (:func:`weights_digest` when training starts, after any checkpoint was loaded, and at the end);
- ``all_reduce_sum``, ``all_reduce_mean``, ``all_gather``, ``broadcast``: :func:`collectives`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The arguments of both scripts."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="any_ddp")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--device-type", default="cpu")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=8, help="train until this many optimizer steps are done")
    parser.add_argument("--out", required=True)
    parser.add_argument("--save", default=None, help="save a checkpoint here at the end")
    parser.add_argument("--load", default=None, help="resume from this checkpoint")
    parser.add_argument("--unnumbered", action="store_true",
                        help="AnyDDPStrategy(parallel_devices=[torch.device(TYPE)] * DEVICES) with the --strategy's start"
                        " method (not on CPU; the Trainer's script only)")
    parser.add_argument("--touch-device", action="store_true",
                        help="allocate a tensor on the device before training (initialises it in this process)")
    return parser.parse_args(argv)


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of every parameter, to compare ranks and runs."""
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().cpu().float().numpy().tobytes())
    return h.hexdigest()


def collectives(rank: int, device: torch.device, all_reduce: Callable[[torch.Tensor, str], torch.Tensor],
                all_gather: Callable[[torch.Tensor], torch.Tensor], broadcast: Callable[[Any], Any]) -> dict[str, Any]:
    """Each collective of the front end once, from every rank: rank ``r`` contributes ``r + 1``."""
    def mine() -> torch.Tensor:  # a fresh tensor per collective: Lightning's all_reduce works in place
        return torch.tensor(float(rank + 1), device=device)

    return {
        "all_reduce_sum": float(all_reduce(mine(), "sum")),
        "all_reduce_mean": float(all_reduce(mine(), "mean")),
        "all_gather": all_gather(torch.tensor([rank], device=device)).flatten().tolist(),
        "broadcast": broadcast({"token": f"from-rank-{rank}"}),
    }


def common(strategy: Any, precision: Any, model: torch.nn.Module) -> dict[str, Any]:
    """The fields every record has that the strategy, its precision plugin and the model tell."""
    return {
        "pid": os.getpid(),
        "strategy": type(strategy).__name__,
        "strategy_module": type(strategy).__module__,
        "launcher": type(strategy.launcher).__name__ if getattr(strategy, "launcher", None) else None,
        "device": str(strategy.root_device),
        "param_device": str(next(model.parameters()).device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "precision_device": getattr(precision, "device", None),
        "weights": weights_digest(model),
    }


def refusal(make: object) -> str:
    """The first line of the error ``make()`` raises (``type: message``), or ``none``."""
    try:
        make()  # type: ignore[operator]
    except Exception as err:  # noqa: BLE001 - the test asserts on the type and the message
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return "none"


def write(out: str | Path, rank: int, record: dict[str, Any]) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
