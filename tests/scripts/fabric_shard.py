"""Sharded training with Lightning Fabric and the package, 2 processes on CPU; one record per rank.

``any_ddp`` runs first (its popen launcher starts rank 1, which re-runs this script); every
later ``Fabric`` in the same processes joins the same process group. Each configuration trains
the same small MLP on the same data for 3 steps, saves a checkpoint, trains 2 more steps,
then loads the checkpoint into a fresh model and optimizer and replays those 2 steps: equal
losses mean weights *and* optimizer state (SGD momentum) came back. Writes ``<out>/rank<N>.json``.

With ``--deepspeed``, DeepSpeed ZeRO-3 runs too, on gloo: its shared-memory CPU collectives are
marked unavailable so that it does not compile them (about a minute; a CPU-only speed-up).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning import Fabric
from torch.utils.data import DataLoader

from lightning_anyaccel.demo import demo_data
from lightning_anyaccel.fabric import AnyAccelerator, AnyDeepSpeedStrategy, AnyFSDPStrategy, AnyModelParallelStrategy

STEPS, MORE = 3, 2


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def local(p: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds (FSDP2: the DTensor's shard; FSDP1: its flat view; ZeRO-3: ds_tensor)."""
    if hasattr(p, "ds_tensor"):
        return p.ds_tensor
    return p.to_local() if hasattr(p, "to_local") else p


def optimizer_for(parameters: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def setup(fabric: Fabric, seed: int) -> tuple[Any, Any]:
    if isinstance(fabric.strategy, AnyDeepSpeedStrategy):  # DeepSpeed sets both up together
        model = make_model(seed)
        return fabric.setup(model, optimizer_for(model.parameters()))
    model = fabric.setup_module(make_model(seed))  # FSDP2 replaces the parameters: optimizer after setup
    return model, fabric.setup_optimizers(optimizer_for(model.parameters()))


def step(fabric: Fabric, model: Any, optimizer: Any, batch: Any) -> float:
    x, y = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    fabric.backward(loss, model=model)  # DeepSpeed: which engine, once a second one exists
    optimizer.step()
    return float(loss.detach())


def train(fabric: Fabric, ckpt: Path) -> dict[str, Any]:
    """Train, save, train on; reload into a fresh model and replay."""
    loader = fabric.setup_dataloaders(DataLoader(demo_data(), batch_size=16))
    batches = [batch for _, batch in zip(range(STEPS + MORE), loader)]
    model, optimizer = setup(fabric, seed=0)
    total = sum(p.numel() for p in make_model(0).parameters())
    losses = [step(fabric, model, optimizer, b) for b in batches[:STEPS]]
    fabric.save(ckpt, {"model": model, "optimizer": optimizer, "step": STEPS})
    losses += [step(fabric, model, optimizer, b) for b in batches[STEPS:]]

    fresh, fresh_optimizer = setup(fabric, seed=1)
    state = {"model": fresh, "optimizer": fresh_optimizer, "step": 0}
    fabric.load(ckpt, state)
    resumed = [step(fabric, fresh, fresh_optimizer, b) for b in batches[STEPS:]]
    difference = max(float((local(a) - local(b)).abs().max()) if local(a).numel() else 0.0
                     for a, b in zip(model.parameters(), fresh.parameters()))
    strategy = fabric.strategy
    mesh = getattr(strategy, "_device_mesh", None)
    return {
        "strategy": f"{type(strategy).__module__}.{type(strategy).__name__}",
        "precision": type(strategy.precision).__name__,
        "losses": losses,
        "resumed_losses": resumed,
        "resumed_weights_difference": difference,
        "loaded_step": state["step"],
        "local_numel": sum(local(p).numel() for p in model.parameters()),
        "total_numel": total,
        "checkpoint_is_dir": ckpt.is_dir(),
        "mesh_device_type": mesh.device_type if mesh is not None else None,
    }


CONFIGS = {
    "fsdp_full": lambda: AnyFSDPStrategy(state_dict_type="full"),
    "fsdp_sharded": lambda: AnyFSDPStrategy(state_dict_type="sharded"),
    "fsdp2_sharded": lambda: "any_fsdp2",
    "fsdp2_full": lambda: AnyModelParallelStrategy(tensor_parallel_size=1, save_distributed_checkpoint=False),
}
#: Lightning's default buckets hold 2e8 elements each (800 MB in fp32) whatever the model size.
BUCKETS = 2_000_000
DEEPSPEED = {
    "deepspeed_3": lambda: AnyDeepSpeedStrategy(stage=3, reduce_bucket_size=BUCKETS, allgather_bucket_size=BUCKETS,
                                                sub_group_size=BUCKETS),
}


def without_deepspeed_shm() -> None:
    """Make DeepSpeed use gloo on CPU instead of compiling its shared-memory collectives."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--deepspeed", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    records: dict[str, Any] = {}
    configs = dict(CONFIGS)
    if args.deepspeed and importlib.util.find_spec("deepspeed") is not None:
        configs.update(DEEPSPEED)

    fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy="any_ddp", devices=2)
    fabric.launch()  # starts rank 1; the later Fabric objects join the existing process group
    records["ddp"] = train(fabric, out / "ddp.ckpt")
    for name, make_strategy in configs.items():
        strategy = make_strategy()
        if isinstance(strategy, AnyDeepSpeedStrategy):
            without_deepspeed_shm()
        fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=strategy, devices=2)
        fabric.launch()
        records[name] = train(fabric, out / f"{name}.ckpt")
        fabric.barrier()

    # a (replicas, shards) mesh tuple: Lightning would build it on "cuda"
    hybrid = AnyFSDPStrategy(device_mesh=(1, 2), sharding_strategy="HYBRID_SHARD")
    fabric = Fabric(accelerator=AnyAccelerator("cpu"), strategy=hybrid, devices=2)
    fabric.launch()
    records["hybrid_mesh_device_type"] = hybrid._fsdp_kwargs["device_mesh"].device_type
    records["rank"] = fabric.global_rank
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
