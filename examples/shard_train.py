"""Train a wide MLP with DDP, FSDP, FSDP2 or DeepSpeed, through the Trainer or Fabric, and write what each rank held.

Used by the tests (``tests/test_sharding_cpu.py``) and by ``docs/memory_table.py``. Example::

    python examples/shard_train.py --strategy fsdp --devices 2 --out /tmp/run
    python examples/shard_train.py --front-end fabric --strategy ddp,fsdp2 --devices 2 --out /tmp/run

``--strategy``: one or more, comma-separated, of ``ddp``, ``fsdp`` (full checkpoints),
``fsdp_sharded``, ``fsdp_hybrid`` (a ``(replicas, shards)`` mesh of 1 x devices), ``fsdp_grad_op``
(``sharding_strategy="SHARD_GRAD_OP"``), ``fsdp_offload`` (``cpu_offload=True``, as
``any_fsdp_cpu_offload``), ``fsdp2`` (distributed checkpoints), ``fsdp2_full``, ``deepspeed_1``,
``deepspeed_2``, ``deepspeed_3``, ``deepspeed_2_offload``, ``deepspeed_3_offload`` (optimizer state and
parameters in host memory, as ``any_deepspeed_stage_3_offload``); several train one after the other in the
same processes (one launch). For each, every rank writes ``<out>/<strategy>/rank<N>.json``: its
losses, how many parameter and optimizer-state elements it holds and on which device, and its peak live
memory (sampled at every step boundary) above what it held just before the model was built. On CPU that is host
memory in use (glibc ``mallinfo2``), not RSS: the allocator keeps freed pages, so RSS shows FSDP's
unsharded start-up copy forever.

``--front-end fabric`` trains the same model on the same data with a Fabric loop (:func:`fabric_fit`)
instead of ``Trainer.fit``. Fabric's FSDP2 takes a ``parallelize_fn`` instead of ``configure_model``;
the package's default shards the whole model as one unit.

``--ckpt-dir DIR --resume-steps N`` checkpoints each strategy at every epoch end to
``DIR/<strategy>/last.ckpt`` and then resumes from it, in the same processes, as a restarted job
would: a new model (and Trainer or Fabric) continues up to ``N`` steps and writes
``<out>/<strategy>/resumed/rank<N>.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
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

import lightning_anyaccel  # registers names; the Trainer's strategies
import lightning_anyaccel.fabric  # Fabric's strategies
from lightning_anyaccel import AnyAccelerator
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import device_of, get_spec, is_host

STRATEGIES = ("ddp", "fsdp", "fsdp_sharded", "fsdp_hybrid", "fsdp_grad_op", "fsdp_offload", "fsdp2", "fsdp2_full",
              "deepspeed_1", "deepspeed_2", "deepspeed_3", "deepspeed_2_offload", "deepspeed_3_offload")


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
        return adam(self.parameters(), lr=self.hparams.lr)


def adam(parameters: Any, lr: float = 1e-3) -> torch.optim.Optimizer:
    """The optimizer of both front ends: its two moments per parameter are the state ZeRO shards."""
    return torch.optim.Adam(parameters, lr=lr)


def wide_loader(width: int, batches_per_rank: int = 3, ranks: int = 2, batch_size: int = 16) -> DataLoader:
    """A fixed regression data set: each of ``ranks`` processes sees ``batches_per_rank`` batches per epoch."""
    generator = torch.Generator().manual_seed(0)
    n = batches_per_rank * ranks * batch_size
    x = torch.randn(n, width, generator=generator)
    y = x[:, :1] - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def build_strategy(name: str, front_end: str = "trainer", devices: int = 2) -> Any:
    """The package strategy of ``front_end`` (``trainer`` or ``fabric``) for a short ``name`` (see above)."""
    family = lightning_anyaccel.fabric if front_end == "fabric" else lightning_anyaccel
    if name == "ddp":
        return family.AnyDDPStrategy()
    if name in ("fsdp", "fsdp_sharded"):
        return family.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear},
                                      state_dict_type="sharded" if name == "fsdp_sharded" else "full")
    if name == "fsdp_hybrid":  # Lightning itself would build this mesh on "cuda"
        return family.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear}, device_mesh=(1, devices),
                                      sharding_strategy="HYBRID_SHARD", state_dict_type="full")
    if name == "fsdp_grad_op":  # gradients and optimizer state sharded; parameters gathered from forward to backward
        return family.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear}, sharding_strategy="SHARD_GRAD_OP",
                                      state_dict_type="full")
    if name == "fsdp_offload":  # what the name any_fsdp_cpu_offload gives: parameter shards in host memory
        return family.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear}, cpu_offload=True, state_dict_type="full")
    if name in ("fsdp2", "fsdp2_full"):
        return family.AnyModelParallelStrategy(tensor_parallel_size=1, save_distributed_checkpoint=name == "fsdp2")
    if name.startswith("deepspeed_"):
        stage = int(name.split("_")[1])
        # Lightning's default buckets hold 2e8 elements each (800 MB in fp32) whatever the model size;
        # size them to the model, or they dwarf what ZeRO saves on a small one
        buckets = 2_000_000
        offload = name.endswith("offload")  # as the names any_deepspeed_stage_{2,3}_offload
        strategy = family.AnyDeepSpeedStrategy(stage=stage, offload_optimizer=offload,
                                               offload_parameters=offload and stage == 3,
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


def local_device(tensor: torch.Tensor) -> str:
    """Where this process keeps ``tensor``'s elements (host memory for an offloaded ZeRO-3 partition)."""
    return str(tensor.ds_tensor.device if hasattr(tensor, "ds_tensor") else tensor.device)


def optimizer_states(optimizer: Any) -> list[torch.Tensor]:
    """The optimizer state tensors (Adam moments) this process holds, through DeepSpeed's wrappers."""
    while not isinstance(optimizer, torch.optim.Optimizer) or hasattr(optimizer, "optimizer"):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return [v for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0]


def optimizer_state_numel(optimizer: Any) -> int:
    """Elements of optimizer state (Adam moments) this process holds, through DeepSpeed's wrappers."""
    return sum(local_numel(v) for v in optimizer_states(optimizer))


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
    if is_host(device.type):
        return live_host_bytes()
    # the package's memory statistics: torch.accelerator's where this torch has them (2.9 and newer),
    # the device module's otherwise, MPS's own counter; none before the process first uses the device
    stats = runtime.memory_stats(get_spec(device.type), device.index)
    return int(stats.get("allocated_bytes.all.current", stats.get("allocated_bytes", 0)))


class PeakMemory:
    """The most live memory seen at the step boundaries where :meth:`sample` is called, above ``before``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()  # what an earlier strategy of the same job left for the collector is not counted in ``before``
        self.before = self.peak = live_device_bytes(device)

    def sample(self) -> None:
        self.peak = max(self.peak, live_device_bytes(self.device))

    @property
    def mib(self) -> float:
        return (self.peak - self.before) / 2**20


def record(rank: int, strategy: Any, step: int, losses: list[float], model: torch.nn.Module, optimizer: Any,
           total_numel: int, memory: PeakMemory) -> dict[str, Any]:
    """What one rank reports about one run (either front end)."""
    mesh = getattr(strategy, "device_mesh", None)
    return {
        "rank": rank,
        "strategy": f"{type(strategy).__module__}.{type(strategy).__name__}",
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "global_step": step,
        "losses": losses,
        "total_numel": total_numel,
        "param_numel": sum(local_numel(p) for p in model.parameters()),
        "param_device": local_device(next(model.parameters())),
        "optimizer_state_numel": optimizer_state_numel(optimizer),
        "optimizer_state_devices": sorted({str(v.device) for v in optimizer_states(optimizer)}),
        "peak_mib": memory.mib,
        "mesh_device_type": mesh.device_type if mesh is not None else None,
    }


class Report(Callback):
    """Samples live memory at every step boundary; writes one JSON file per rank at the end of fit."""

    def __init__(self, out: Path, memory: PeakMemory) -> None:
        self.out = out
        self.memory = memory

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self.memory.sample()

    def on_after_backward(self, trainer: L.Trainer, *args: Any) -> None:
        self.memory.sample()

    def on_before_optimizer_step(self, trainer: L.Trainer, *args: Any) -> None:
        self.memory.sample()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.memory.sample()

    def on_train_end(self, trainer: L.Trainer, pl_module: WideMLP) -> None:
        result = record(trainer.global_rank, trainer.strategy, trainer.global_step, pl_module.losses,
                        trainer.strategy.model, trainer.optimizers[0], pl_module.total_numel, self.memory)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))


def trainer_fit(args: argparse.Namespace, strategy: str, out: Path, max_steps: int, resume: Path | None,
                ckpt_dir: Path | None) -> None:
    """One fit of a freshly built model and Trainer (a restarted job builds both anew as well)."""
    L.seed_everything(1234, verbose=False)
    accelerator = AnyAccelerator(args.device_type)
    # this rank's device: the launcher sets LOCAL_RANK in every rank it starts; the first rank is 0
    memory = PeakMemory(device_of(accelerator.device_type, int(os.environ.get("LOCAL_RANK", "0"))))
    model = WideMLP(args.width, args.depth)
    callbacks: list[Callback] = [Report(out, memory)]
    if ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=0, every_n_epochs=1))
    trainer = L.Trainer(
        accelerator=accelerator,
        strategy=build_strategy(strategy, "trainer", args.devices),
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


def fabric_setup(fabric: L.Fabric, model: torch.nn.Module) -> tuple[Any, Any]:
    """The model first, the optimizer after it (FSDP2 replaces the parameters); DeepSpeed sets up both at once."""
    if isinstance(fabric.strategy, lightning_anyaccel.fabric.AnyDeepSpeedStrategy):
        return fabric.setup(model, adam(model.parameters()))
    model = fabric.setup_module(model)
    return model, fabric.setup_optimizers(adam(model.parameters()))


def fabric_step(fabric: L.Fabric, model: Any, optimizer: Any, batch: Any) -> float:
    """One training step; ``model=`` tells DeepSpeed which engine once a second one exists."""
    x, y = batch
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    fabric.backward(loss, model=model)
    optimizer.step()
    return float(loss.detach())


def fabric_fit(args: argparse.Namespace, strategy: str, out: Path, max_steps: int, resume: Path | None,
               ckpt_dir: Path | None) -> None:
    """The Fabric loop of :func:`trainer_fit`: the same model, data, optimizer, epochs and checkpoints."""
    fabric = L.Fabric(accelerator=AnyAccelerator(args.device_type), devices=args.devices, precision=args.precision,
                      strategy=build_strategy(strategy, "fabric", args.devices))
    fabric.launch()  # the first one starts the other ranks; later ones join the existing process group
    fabric.seed_everything(1234, verbose=False)
    memory = PeakMemory(fabric.device)
    module = WideMLP(args.width, args.depth)
    model, optimizer = fabric_setup(fabric, module)
    loader = fabric.setup_dataloaders(wide_loader(args.width, ranks=args.devices))
    state = {"model": model, "optimizer": optimizer, "step": 0}
    if resume:
        fabric.load(resume, state)
    losses: list[float] = []
    while state["step"] < max_steps:
        for batch in loader:
            memory.sample()
            losses.append(fabric_step(fabric, model, optimizer, batch))
            memory.sample()
            state["step"] += 1
            if state["step"] == max_steps:
                break
        if ckpt_dir and state["step"] % len(loader) == 0:  # an epoch ended: as ModelCheckpoint(every_n_epochs=1)
            fabric.save(ckpt_dir / "last.ckpt", state)
    result = record(fabric.global_rank, fabric.strategy, state["step"], losses, model, optimizer,
                    module.total_numel, memory)
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(result))
    fabric.barrier()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="fsdp", help=f"one or more of {', '.join(STRATEGIES)}, comma-separated")
    parser.add_argument("--front-end", choices=("trainer", "fabric"), default="trainer")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--device-type", default=None)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--resume-steps", type=int, default=None,
                        help="then continue from <ckpt-dir>/<strategy>/last.ckpt to this many steps, same processes")
    args = parser.parse_args(argv)
    strategies = args.strategy.split(",")
    if unknown := [name for name in strategies if name not in STRATEGIES]:
        parser.error(f"--strategy: {', '.join(unknown)} not among {', '.join(STRATEGIES)}")
    if args.resume_steps is not None and not args.ckpt_dir:
        parser.error("--resume-steps resumes from the checkpoints of --ckpt-dir: give --ckpt-dir too")
    torch.set_num_threads(1)
    fit = fabric_fit if args.front_end == "fabric" else trainer_fit
    for strategy in strategies:
        out = Path(args.out, strategy)
        ckpt_dir = Path(args.ckpt_dir, strategy) if args.ckpt_dir else None
        out.mkdir(parents=True, exist_ok=True)
        fit(args, strategy, out, args.max_steps, resume=None, ckpt_dir=ckpt_dir)
        if args.resume_steps is not None and ckpt_dir is not None:
            (out / "resumed").mkdir(exist_ok=True)
            fit(args, strategy, out / "resumed", args.resume_steps, resume=ckpt_dir / "last.ckpt", ckpt_dir=None)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
