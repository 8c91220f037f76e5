r"""Parity: N processes of a strategy compute what one device computes, step by step and tensor by tensor.

A small MLP (its first layer frozen) trains ``k`` steps with SGD and momentum, gradient clipping on,
from the same initial weights and the same rows, twice: once serially on one device with the whole
global batch (``parity_run.reference_run``, plain torch), and once through a strategy on N processes, each
with its share of the batch (:class:`ParityModule` inside ``Trainer.fit``). Each run records per step
the global gradient norm before and after clipping, every trainable tensor's full gradient and
update, and every frozen tensor's value; ``parity_compare.compare`` requires them to match within a tolerance
and raises :class:`ParityError` naming the step and tensor that differ.

A ``DistributedSampler`` without shuffling gives rank ``r`` rows ``r, r + N, ...``: the N shares of step
``s`` together are rows ``s * B`` to ``(s + 1) * B`` of the data set, the reference's batch ``s``. Each
rank's loss is the mean over its share; the strategy averages the gradients, which equals the
gradient of the mean over the whole batch. With tensor parallelism (``any_model_parallel``'s default: the
processes of a node form one tensor-parallel group) the middle layers are split column-wise, then
row-wise, across the group, whose ranks take the same rows: the data-parallel ranks share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

#: fp32 tolerance of ``parity_compare.compare``: every relative difference measured on CPU and the emulated
#: devices with DDP, FSDP, FSDP2 and DeepSpeed ZeRO-1/2/3 is below 1e-6 (reduction order only).
RTOL, ATOL = 1e-5, 1e-6
#: bf16-mixed (``parity_compare.compare_bf16``): a tensor's relative 2-norm difference ``|a - b| / |b|`` from the serial
#: bf16 run. bf16 keeps 8 significant bits (spacing 2**-8 = 3.9e-3): each rank's weight gradient is rounded
#: to bf16 over its half of the rows, the serial one over all rows, so elements differ by a few 2**-8;
#: a broken reduction differs by 0.2 or more (the negative controls).
BF16_RTOL = 2e-2
#: The validity gate of ``parity_compare.compare_bf16``: the serial bf16 run differs from the serial fp32 run by at
#: least this (relative 2-norm, some gradient), or autocast did not compute in bf16 and the check proves nothing.
BF16_GATE = 1e-4
INPUTS, HIDDEN, PER_RANK_BATCH, STEPS, CLIP, LR = 16, 32, 8, 3, 0.5, 0.1
#: Options of :class:`ParityModule` that break a strategy on purpose: the check must reject each.
CONTROLS = ("none", "drop_rank_grad", "sum_grads", "skip_update", "unsharded_param")


class ParityError(AssertionError):
    """A run that does not reproduce the reference: the message names the step and the tensor."""


class Gain(torch.nn.Module):
    """Multiplies by one trainable scalar: the parameter the ``unsharded_param`` control keeps out of FSDP2."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = torch.nn.Parameter(torch.ones(1))

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


def build_net() -> torch.nn.Sequential:
    """The model of both runs, seeded: the same initial weights in every process and in the reference."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(INPUTS, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                              torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1), Gain())
    net[0].requires_grad_(False)  # frozen: must stay bit-identical
    return net


def dataset(world_size: int) -> TensorDataset:
    """``STEPS`` global batches of ``world_size * PER_RANK_BATCH`` rows (a fixed regression)."""
    generator = torch.Generator().manual_seed(1)
    rows = STEPS * world_size * PER_RANK_BATCH
    x = torch.randn(rows, INPUTS, generator=generator)
    y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2] + 0.1 * torch.randn(rows, 1, generator=generator)
    return TensorDataset(x, y)


def loader(world_size: int, rank: int, replicas: int | None = None) -> DataLoader[Any]:
    """Rank ``rank``'s loader: rows ``rank, rank + replicas, ...`` in order (no shuffling, whatever the Trainer does).

    ``replicas`` (default ``world_size``) is how many ways the global batch of ``world_size * PER_RANK_BATCH``
    rows is split: with tensor parallelism, the data-parallel size (a tensor-parallel group sees the same rows).
    """
    from torch.utils.data.distributed import DistributedSampler

    replicas = replicas or world_size
    data = dataset(world_size)
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=False)
    return DataLoader(data, batch_size=world_size * PER_RANK_BATCH // replicas, sampler=sampler)


def _clean(name: str) -> str:
    for wrapper in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name.removeprefix("net.")


def host(tensor: Any) -> torch.Tensor:
    """``tensor`` (a DTensor too: every rank takes part) as a full fp32 copy on the host."""
    if hasattr(tensor, "full_tensor"):  # a DTensor (FSDP2): every rank takes part
        tensor = tensor.full_tensor()
    return torch.as_tensor(tensor).detach().to("cpu", torch.float32).clone()


def global_norm(grads: dict[str, torch.Tensor]) -> float:
    """The 2-norm over every gradient, as ``clip_grad_norm_`` computes it (in float64 here)."""
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))


@dataclass
class StepRecord:
    """What one optimizer step computed, as full (unsharded) tensors on the host."""

    norm_before: float = 0.0
    norm_after: float = 0.0
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    update: dict[str, torch.Tensor] = field(default_factory=dict)
    frozen: dict[str, torch.Tensor] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"norm_before": self.norm_before, "norm_after": self.norm_after, "grads": self.grads,
                "update": self.update, "frozen": self.frozen}


def launching() -> bool:
    """Whether this process is the one started for the run, not a rank a strategy launched from it (no rank is set)."""
    import os

    return all(os.environ.get(key, "0") == "0" for key in ("LOCAL_RANK", "NODE_RANK", "RANK"))


def kind_of(strategy: Any, net: torch.nn.Module) -> str:
    """How a ``strategy`` (either front end's) holds the parameters of ``net``.

    ``deepspeed``, ``fsdp`` (FSDP1), ``fsdp2`` (DTensor parameters: FSDP2, tensor parallelism) or ``plain``.
    """
    name = type(strategy).__name__
    if "DeepSpeed" in name:
        return "deepspeed"
    if "FSDP" in name:
        return "fsdp"
    return "fsdp2" if any(hasattr(p, "full_tensor") for p in net.parameters()) else "plain"


def full_tensors(kind: str, net: torch.nn.Module, root: Any, grads: bool = False) -> dict[str, torch.Tensor]:
    """Every parameter of ``net`` (or trainable parameter's gradient) as a full host tensor; collective on every rank.

    ``kind`` is :func:`kind_of`'s answer; ``root`` the module the strategy returned (FSDP1 gathers through the
    root ``FullyShardedDataParallel`` in it).
    """
    named = [(_clean(n), p) for n, p in net.named_parameters() if p.requires_grad or not grads]
    if kind == "deepspeed":
        return _deepspeed_tensors(named, grads)
    if kind == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        fsdp_root = FullyShardedDataParallel.fsdp_modules(root, root_only=True)[0]
        with FullyShardedDataParallel.summon_full_params(fsdp_root, with_grads=grads, writeback=False):
            named = [(_clean(n), p) for n, p in net.named_parameters() if p.requires_grad or not grads]
            return {n: host(p.grad if grads else p) for n, p in named}
    return {n: host(p.grad if grads else p) for n, p in named}


def scale_to_clip(net: torch.nn.Module, norm: float) -> None:
    """Clip by scaling every gradient of ``net`` with ``CLIP / norm`` where ``norm`` (the global norm) exceeds ``CLIP``.

    For FSDP2: the global norm, measured from the full gradients, scales every shard by a Python number;
    torch's ``clip_grad_norm_`` multiplies DTensor gradients by a device tensor, which DTensor's dispatch
    refuses on the emulated hpu (an AssertionError in torch 2.13).
    """
    coefficient = clip_coefficient(norm)
    for p in net.parameters():
        if p.grad is not None:
            p.grad.mul_(coefficient)


def deepspeed_strategy(cls: Any, name: str) -> Any:
    """A DeepSpeed strategy of either front end for ``deepspeed_<stage>[_offload]``: the torch SGD (also with
    offload), buckets small enough for the parity model."""
    stage, offload = int(name.split("_")[1]), name.endswith("offload")
    strategy = cls(stage=stage, offload_optimizer=offload, offload_parameters=offload and stage == 3,
                   reduce_bucket_size=2_000_000, allgather_bucket_size=2_000_000, sub_group_size=2_000_000)
    strategy.config["zero_force_ds_cpu_optimizer"] = False
    return strategy


def controlled_loss(loss: torch.Tensor, control: str | None, rank: int, world_size: int) -> torch.Tensor:
    """``loss`` as a negative control breaks it: rank 1's gradient left out (``drop_rank_grad``), or every
    rank's gradient scaled by the world size, so that the average becomes a sum (``sum_grads``)."""
    if control == "drop_rank_grad" and rank == 1:
        return loss * 0.0
    if control == "sum_grads":
        return loss * world_size
    return loss


def clip_coefficient(norm: float) -> float:
    """The factor ``clip_grad_norm_`` (and DeepSpeed's engine) scales gradients of global norm ``norm`` by."""
    return min(1.0, CLIP / (norm + 1e-6))


class ParityModule(LightningModule):
    """:func:`build_net` trained by a strategy; records each step as full tensors (:attr:`steps`).

    ``control`` breaks the run on purpose (:data:`CONTROLS`): rank 1's gradient left out
    (``drop_rank_grad``), gradients summed instead of averaged (``sum_grads``), rank 1 skipping the
    update (``skip_update``), the gain outside every FSDP2 shard (``unsharded_param``). With ``out``, each
    rank writes its steps to ``out/rank<N>.pt`` when training ends (in the process that trained: also
    in the children of the ``spawn`` and ``fork`` start methods).
    """

    def __init__(self, control: str = "none", out: Path | None = None) -> None:
        super().__init__()
        if control not in CONTROLS:
            raise ValueError(f"control must be one of {CONTROLS}, not {control!r}")
        self.net = build_net()
        self.control = control
        self.out = out
        #: the control runs past the FSDP2 guard (strategies/model_parallel.py) to show parity rejects it too
        self.allow_unsharded_parameters = control == "unsharded_param"
        self.steps: list[dict[str, Any]] = []
        self.losses: list[float] = []
        self.param_device = self.batch_device = ""
        self._before: dict[str, torch.Tensor] = {}
        self._record = StepRecord()

    @override
    def configure_model(self) -> None:
        mesh = self.device_mesh
        if mesh is None:
            return  # DDP, FSDP1 (wraps by policy), DeepSpeed (partitions itself)
        from torch.distributed.fsdp import fully_shard

        if mesh["tensor_parallel"].size() > 1:  # any_model_parallel: the middle layers split across the group
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.net, mesh["tensor_parallel"], {"2": ColwiseParallel(), "4": RowwiseParallel()})
        for layer in self.net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh["data_parallel"])
        if self.control != "unsharded_param":  # the root group holds the gain
            fully_shard(self.net, mesh=mesh["data_parallel"])

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @override
    def train_dataloader(self) -> DataLoader[Any]:
        mesh = self.device_mesh
        if mesh is None:
            return loader(self.trainer.world_size, self.trainer.global_rank)
        data_parallel = mesh["data_parallel"]
        return loader(self.trainer.world_size, data_parallel.get_local_rank(), data_parallel.size())

    @override
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x).float(), y)
        self.losses.append(float(loss.detach()))
        return controlled_loss(loss, self.control, self.global_rank, self.trainer.world_size)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=LR, momentum=0.9)

    def full_tensors(self, grads: bool = False) -> dict[str, torch.Tensor]:
        """Every parameter (or trainable parameter's gradient) as a full host tensor; collective on every rank."""
        return full_tensors(kind_of(self.trainer.strategy, self), self, self.trainer.strategy.model, grads)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.param_device, self.batch_device = str(next(self.net[2].parameters()).device), str(batch[0].device)
        self._before = self.full_tensors()
        self._record = StepRecord()

    @override
    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        grads = self.full_tensors(grads=True)
        self._record.grads, self._record.norm_before = grads, global_norm(grads)
        kind = kind_of(self.trainer.strategy, self)
        if kind == "deepspeed":  # the engine clips inside its step, by the same rule as torch
            coefficient = clip_coefficient(self._record.norm_before)
            self._record.norm_after = global_norm({n: g * coefficient for n, g in grads.items()})
            return
        if kind == "fsdp":
            root: Any = self.trainer.strategy.model  # FSDP's own clipping: the norm over every shard
            root.clip_grad_norm_(CLIP)
        elif kind == "fsdp2":
            scale_to_clip(self, self._record.norm_before)
        else:
            torch.nn.utils.clip_grad_norm_([p for p in self.parameters() if p.requires_grad], CLIP)
        self._record.norm_after = global_norm(self.full_tensors(grads=True))

    @override
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        if self.control == "skip_update" and self.global_rank == 1:
            optimizer_closure()  # forward and backward (and their collectives), but no update
            self.configure_gradient_clipping(optimizer)  # as the step's closure would: clip and record
            return
        optimizer.step(closure=optimizer_closure)

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        after = self.full_tensors()
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        self._record.update = {n: after[n] - self._before[n] for n in map(_clean, trainable)}
        self._record.frozen = {n: t for n, t in after.items() if n not in self._record.update}
        self.steps.append(self._record.as_dict())

    @override
    def on_train_end(self) -> None:
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            torch.save(self.steps, self.out / f"rank{self.global_rank}.pt")


def _deepspeed_tensors(named: Sequence[tuple[str, torch.Tensor]], grads: bool) -> dict[str, torch.Tensor]:
    """Full tensors under ZeRO-1/2/3 through DeepSpeed's public helpers (ZeRO-3 gathers on every rank)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    if grads:
        return {n: host(safe_get_full_grad(p)) for n, p in named}
    params = [p for _, p in named]
    zero3 = any(hasattr(p, "ds_id") for p in params)
    if not zero3:
        return {n: host(p) for n, p in named}
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        return {n: host(p) for n, p in named}


__all__ = ["ATOL", "BF16_GATE", "BF16_RTOL", "CONTROLS", "RTOL", "ParityError", "ParityModule", "StepRecord",
           "build_net", "clip_coefficient", "full_tensors", "global_norm", "host", "kind_of", "launching",
           "loader", "scale_to_clip"]
