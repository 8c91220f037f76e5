r"""Parity for Fabric: :mod:`~lightning_anyaccel.kit.tools.parity`'s model and rows trained by a plain Fabric loop.

The loop Fabric users write: ``fabric.setup`` (the module, then the optimizer; DeepSpeed takes both at
once), forward, ``fabric.backward``, ``fabric.clip_gradients``, ``optimizer.step``, with the package's
Fabric strategies (``lightning_anyaccel.fabric``). Each step is recorded as the Trainer's run records
it (the global gradient norm before and after clipping, every gradient and update as full tensors,
the frozen layer), so ``parity_compare.compare`` judges both front ends against the same serial run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lightning_anyaccel.kit.tools import parity

if TYPE_CHECKING:
    from lightning_anyaccel.accelerator import AnyAccelerator

#: Short names of the Fabric runs (:func:`build_strategy`): ``fabric_`` and the Trainer run of the same strategy.
STRATEGIES = ("fabric_ddp", "fabric_fsdp", "fabric_fsdp2", "fabric_model_parallel", "fabric_deepspeed_1",
              "fabric_deepspeed_2", "fabric_deepspeed_3", "fabric_deepspeed_1_offload", "fabric_deepspeed_2_offload",
              "fabric_deepspeed_3_offload")


def shard_each_layer(module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
    """The ``parallelize_fn`` of the FSDP2 run: ``fully_shard`` on each linear layer, then on the root (the gain)."""
    from torch.distributed.fsdp import fully_shard

    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=device_mesh["data_parallel"])
    fully_shard(module, mesh=device_mesh["data_parallel"])
    return module


def split_middle_layers(module: torch.nn.Module, device_mesh: Any) -> torch.nn.Module:
    """The ``parallelize_fn`` of the tensor-parallel run: the middle layers split across the tensor-parallel group
    (column-wise, then row-wise), then :func:`shard_each_layer` over the data-parallel dimension."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(module, device_mesh["tensor_parallel"], {"2": ColwiseParallel(), "4": RowwiseParallel()})
    return shard_each_layer(module, device_mesh)


def build_strategy(name: str) -> Any:
    """The package's Fabric strategy for a short ``name`` of :data:`STRATEGIES`, set up as the Trainer run's."""
    from lightning_anyaccel import fabric

    anyaccel: Any = fabric  # the strategy classes are published from the family table at import
    short = name.removeprefix("fabric_")
    if short == "ddp":
        return anyaccel.AnyDDPStrategy()
    if short == "fsdp":  # use_orig_params: summon_full_params can gather the gradients
        return anyaccel.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear}, use_orig_params=True)
    if short == "fsdp2":
        return anyaccel.AnyModelParallelStrategy(shard_each_layer, tensor_parallel_size=1)
    if short == "model_parallel":  # Lightning's defaults: tensor parallel across the node's processes
        return anyaccel.AnyModelParallelStrategy(split_middle_layers)
    if short.startswith("deepspeed_"):
        strategy = parity.deepspeed_strategy(anyaccel.AnyDeepSpeedStrategy, short)
        strategy.config["gradient_clipping"] = parity.CLIP  # Fabric leaves clipping to the engine's step
        return strategy
    raise ValueError(f"--strategy must be among {STRATEGIES}, not {name!r}")


def fit(accelerator: AnyAccelerator, name: str, devices: int, num_nodes: int, precision: str, out: Path,
        control: str = "none") -> None:
    """Train ``parity.STEPS`` steps with Fabric and the strategy ``name``; this rank's steps go to ``out/rank<N>.pt``.

    ``control`` breaks the run on purpose as :class:`~lightning_anyaccel.kit.tools.parity.ParityModule`'s does
    (``drop_rank_grad``, ``sum_grads``, ``skip_update``; ``unsharded_param`` is the Trainer's only).
    """
    from lightning.fabric import Fabric

    if control not in parity.CONTROLS or control == "unsharded_param":
        raise ValueError(f"control must be one of {parity.CONTROLS[:-1]} for Fabric, not {control!r}")
    fabric = Fabric(accelerator=accelerator, strategy=build_strategy(name), devices=devices,
                    num_nodes=num_nodes, precision=precision)  # type: ignore[arg-type]  # a str of its literals
    fabric.launch()
    net = parity.build_net()
    optimizer: Any
    if "deepspeed" in name:  # DeepSpeed's engine takes the model and its optimizer together
        optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=parity.LR, momentum=0.9)
        module, optimizer = fabric.setup(net, optimizer)
    else:  # FSDP and FSDP2 shard first: the optimizer holds the sharded parameters
        module = fabric.setup_module(net)
        optimizer = fabric.setup_optimizers(
            torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=parity.LR, momentum=0.9))
    kind = parity.kind_of(fabric.strategy, net)
    rank, replicas = fabric.global_rank, fabric.world_size
    if name == "fabric_model_parallel":  # the ranks of one tensor-parallel group see the same rows
        strategy: Any = fabric.strategy  # the package's model-parallel strategy: it has a device mesh
        data_parallel = strategy.device_mesh["data_parallel"]
        rank, replicas = data_parallel.get_local_rank(), data_parallel.size()
    batches = fabric.setup_dataloaders(parity.loader(fabric.world_size, rank, replicas), use_distributed_sampler=False)
    steps = []
    for x, y in batches:
        before = parity.full_tensors(kind, net, module)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x).float(), y)
        if control == "drop_rank_grad" and fabric.global_rank == 1:
            loss = loss * 0.0
        if control == "sum_grads":
            loss = loss * fabric.world_size
        fabric.backward(loss, model=module)
        record = parity.StepRecord(grads=parity.full_tensors(kind, net, module, grads=True))
        record.norm_before = parity.global_norm(record.grads)
        if kind == "deepspeed" or name == "fabric_model_parallel":  # the update shows the clipped gradients
            coefficient = parity.clip_coefficient(record.norm_before)
            record.norm_after = parity.global_norm({n: g * coefficient for n, g in record.grads.items()})
            if kind != "deepspeed":  # DeepSpeed's engine clips inside its step (config "gradient_clipping")
                # torch's clip_grad_norm_ (Fabric's clip_gradients) stacks the per-tensor norms, which DTensor
                # refuses when they live on different meshes (the split layers on the 2-D mesh, the gain on the
                # data-parallel one; torch 2.13): the same rule, with the norm of the full gradients
                parity.scale_to_clip(net, record.norm_before)
        else:
            fabric.clip_gradients(module, optimizer, max_norm=parity.CLIP)
            record.norm_after = parity.global_norm(parity.full_tensors(kind, net, module, grads=True))
        if not (control == "skip_update" and fabric.global_rank == 1):
            optimizer.step()
        after = parity.full_tensors(kind, net, module)
        record.update = {n: after[n] - before[n] for n in record.grads}
        record.frozen = {n: t for n, t in after.items() if n not in record.update}
        steps.append(record.as_dict())
    out.mkdir(parents=True, exist_ok=True)
    torch.save(steps, out / f"rank{fabric.global_rank}.pt")


__all__ = ["STRATEGIES", "build_strategy", "fit", "shard_each_layer", "split_middle_layers"]
