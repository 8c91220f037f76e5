"""Training script for the fault-matrix tests: one strategy, one front end, one injected fault.

Trains :class:`~lightning_anyaccel.kit.tools.demo.DemoModel`'s network on CPU with the package's DDP, FSDP,
FSDP2 or DeepSpeed strategy through the Trainer or Fabric, and writes ``<out>/rank<N>.json``
(rank, per-step losses, how it ended). Faults (``--fault``, by ``--fault-rank`` at step
``--fault-step``): ``kill`` (SIGKILL itself), ``stop`` (SIGSTOP itself), ``raise`` (an error in
``training_step``), ``absent`` (stops before joining the process group: a rank that never
arrives), ``term`` (SIGTERM to the whole job, what a scheduler does), ``sleep`` (sleeps forever in
``training_step``: a hang outside any collective), ``loader`` (the rank's DataLoader worker never
finishes its start; with ``--num-workers 1``). ``--stall-timeout S`` sets the strategies' stall
watchdog; ``--num-workers N`` gives the training DataLoader N worker processes; ``--max-steps 0``
trains until killed (the launcher-killed cells). ``--hang-save-at STEP``
with ``--hang-after-files N`` stops the sharded save of step STEP after N files were written and
waits to be killed (``N=-1``: after all files, right before the new checkpoint takes the old one's
place); a single-file save (DDP) stops after writing half of the file. ``--io direct`` (DDP): a
writer that writes straight into the target file instead of the package's atomic one (the control).

One node or several: ``--num-nodes N`` with ``NODE_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set
per node, as the environment-variable launch does; each node's command starts its 2 processes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import lightning_anyaccel  # noqa: F401  (registers names)
from lightning_anyaccel.checkpoints import atomic_commit
from lightning_anyaccel.checkpoints.checkpoint import AtomicCheckpointIO
from lightning_anyaccel.checkpoints.preemption import PreemptionCheckpoint
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_data, demo_loader
from lightning_anyaccel.strategies import atomic_save


def rank_of_process() -> int:
    """This process's rank as far as the environment says before any process group exists."""
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def mark_fault(args: argparse.Namespace, rank: int, what: str) -> None:
    """Say what is injected (log) and when (``<out>/fault.<rank>``: the time the tests measure from)."""
    (Path(args.out) / f"fault.{rank}").write_text(str(time.time()))
    sys.stderr.write(f"[fault_train] rank {rank}: {what}\n")
    sys.stderr.flush()


def inject(args: argparse.Namespace, rank: int, step: int) -> None:
    """Apply ``--fault`` if this is the rank and the step."""
    if args.fault == "none" or rank != args.fault_rank or step != args.fault_step:
        return
    mark_fault(args, rank, f"injecting {args.fault} at step {step}")
    if args.fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif args.fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif args.fault == "raise":
        raise RuntimeError(f"injected fault: training_step raised on rank {rank} at step {step}")
    elif args.fault == "term":
        os.killpg(0, signal.SIGTERM)  # the scheduler signals every process of the job


def sleep_forever() -> None:
    """A hang outside any collective (a rank stuck in user code)."""
    while True:
        time.sleep(1)


def start_worker(args: argparse.Namespace, rank: int) -> Any:
    """The DataLoader's ``worker_init_fn``: with ``--fault loader``, the fault rank's worker never finishes its start."""
    def init(worker_id: int) -> None:
        if args.fault == "loader" and rank == args.fault_rank:
            mark_fault(args, rank, "its DataLoader worker hangs in its start")
            sleep_forever()
    return init


def train_loader(args: argparse.Namespace) -> Any:
    """The training data: the demo loader, with ``--num-workers`` worker processes."""
    from torch.utils.data import DataLoader

    if not args.num_workers:
        return demo_loader()
    return DataLoader(demo_data(), batch_size=32, num_workers=args.num_workers, persistent_workers=True,
                      worker_init_fn=start_worker(args, rank_of_process()))


class Record:
    """Collects losses and writes ``rank<N>.json``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.losses: dict[int, float] = {}

    def write(self, rank: int, **extra: Any) -> None:
        (self.out / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "losses": self.losses, **extra}))


class FaultCallback(Callback):
    def __init__(self, args: argparse.Namespace, record: Record) -> None:
        self.args = args
        self.record = record

    def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
        inject(self.args, trainer.global_rank, trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, *_: Any) -> None:
        self.record.losses[trainer.global_step - 1] = float(outputs["loss"])
        self.record.write(trainer.global_rank, global_step=trainer.global_step, finished=False)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.record.write(trainer.global_rank, global_step=trainer.global_step, finished=True)


class FaultModel(DemoModel):
    """The demo model with SGD momentum: an optimizer with state, so checkpoints must carry it.

    (Plain SGD has no state, and Lightning 2.6's FSDP sharded checkpoint of it does not load back.)
    ``fault``: ``(rank, step)`` at which ``training_step`` sleeps forever (``--fault sleep``).
    """

    fault: tuple[int, int] | None = None
    out: Path | None = None

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.fault == (self.global_rank, self.global_step) and self.out is not None:
            (self.out / f"fault.{self.global_rank}").write_text(str(time.time()))
            sys.stderr.write(f"[fault_train] rank {self.global_rank}: sleeping in training_step\n")
            sys.stderr.flush()
            sleep_forever()
        return super().training_step(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class FSDP2Model(FaultModel):
    """The demo model, sharded with FSDP2 (``fully_shard``) over the strategy's mesh."""

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if any(p.requires_grad for p in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)


def without_deepspeed_shm() -> None:
    """gloo instead of compiling DeepSpeed's CPU-only shared-memory op (about a minute); imported only when used."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class DirectCheckpointIO(AtomicCheckpointIO):
    """The control: writes straight into the target file, as a non-atomic writer would."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as file:
            self._write(checkpoint, file)


def trainer_strategy(args: argparse.Namespace) -> Any:
    from lightning_anyaccel import AnyDDPStrategy
    from lightning_anyaccel.strategies import AnyDeepSpeedStrategy, AnyFSDPStrategy, AnyModelParallelStrategy

    timeout = timedelta(seconds=args.timeout)
    stall = {"stall_timeout": args.stall_timeout} if args.stall_timeout is not None else {}
    if args.strategy == "ddp":
        io = DirectCheckpointIO() if args.io == "direct" else None
        return AnyDDPStrategy(timeout=timeout, start_method=args.start_method, checkpoint_io=io, **stall)
    if args.strategy == "fsdp":
        return AnyFSDPStrategy(timeout=timeout, state_dict_type="sharded", **stall)
    if args.strategy == "fsdp_full":
        return AnyFSDPStrategy(timeout=timeout, state_dict_type="full", **stall)
    if args.strategy == "fsdp2":
        return AnyModelParallelStrategy(tensor_parallel_size=1, timeout=timeout, **stall)
    if args.strategy == "deepspeed":
        without_deepspeed_shm()
        return AnyDeepSpeedStrategy(stage=2, timeout=timeout, **stall)
    raise ValueError(args.strategy)


def run_trainer(args: argparse.Namespace, out: Path) -> None:
    record = Record(out)
    callbacks: list[Callback] = [FaultCallback(args, record)]
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, save_top_k=-1,
                                         every_n_train_steps=args.save_every))
        callbacks.append(PreemptionCheckpoint(args.ckpt_dir))
    trainer = L.Trainer(
        accelerator="any", strategy=trainer_strategy(args), devices=args.devices, num_nodes=args.num_nodes,
        max_steps=args.max_steps or -1, max_epochs=None if args.max_steps else 10**6, logger=False, enable_checkpointing=bool(args.ckpt_dir),
        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
        default_root_dir=str(out),
    )
    model = FSDP2Model() if args.strategy == "fsdp2" else FaultModel()
    if args.fault == "sleep":
        model.fault, model.out = (args.fault_rank, args.fault_step), out
    trainer.fit(model, train_loader(args), ckpt_path=args.resume)
    if trainer.global_rank == 0:
        (out / "done").write_text(str(trainer.global_step))


def run_fabric(args: argparse.Namespace, out: Path) -> None:
    from lightning_anyaccel.fabric import AnyDDPStrategy, AnyFSDPStrategy

    timeout = timedelta(seconds=args.timeout)
    stall = {"stall_timeout": args.stall_timeout} if args.stall_timeout is not None else {}
    strategy = {"ddp": lambda: AnyDDPStrategy(timeout=timeout, start_method=args.start_method, **stall),
                "fsdp": lambda: AnyFSDPStrategy(timeout=timeout, state_dict_type="sharded", **stall)}[args.strategy]()
    fabric = L.Fabric(accelerator="any", strategy=strategy, devices=args.devices, num_nodes=args.num_nodes)
    if args.start_method == "popen":
        fabric.launch()
        fabric_loop(fabric, args, out)
    else:  # spawn/fork: the loop runs in the started processes
        fabric.launch(fabric_loop, args, out)


def fabric_loop(fabric: L.Fabric, args: argparse.Namespace, out: Path) -> None:
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    model = DemoModel().net
    model = fabric.setup_module(model)
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.05))
    loader = fabric.setup_dataloaders(DataLoader(demo_data(), batch_size=32, num_workers=args.num_workers,
                                                 worker_init_fn=start_worker(args, fabric.global_rank)))
    record = Record(out)
    batches = loader if args.max_steps else (batch for _ in range(10**6) for batch in loader)  # 0: until killed
    for step, (x, y) in zip(range(args.max_steps or 10**9), batches):
        inject(args, fabric.global_rank, step)
        if args.fault == "sleep" and (fabric.global_rank, step) == (args.fault_rank, args.fault_step):
            mark_fault(args, fabric.global_rank, "sleeping in the training step")
            sleep_forever()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        optimizer.step()
        record.losses[step] = float(loss.detach())
        if args.ckpt_dir and (step + 1) % args.save_every == 0:
            fabric.save(Path(args.ckpt_dir) / f"step{step + 1}.ckpt", {"model": model, "optimizer": optimizer})
    record.write(fabric.global_rank)


def hang_during_saves(args: argparse.Namespace, out: Path) -> None:
    """Make the save of step ``--hang-save-at`` stop after ``--hang-after-files`` files, signal, and wait."""
    state = {"saving": False, "files": 0}

    def hang(where: str) -> None:
        (out / f"saving.{rank_of_process()}").write_text(where)
        while True:
            time.sleep(1)

    def count(original: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            result = original(*a, **k)
            if state["saving"]:
                state["files"] += 1
                if args.hang_after_files >= 0 and state["files"] > args.hang_after_files:
                    hang(f"after {state['files']} files")
            return result
        return wrapped

    os.fsync = count(os.fsync)  # torch's distributed checkpoint fsyncs every file it writes
    torch.save = count(torch.save)  # DeepSpeed and single-file checkpoints

    original_save_atomically = atomic_save.save_atomically
    original_commit = atomic_commit.commit

    def save_atomically(strategy: Any, path: Any, write: Any) -> None:
        step = getattr(getattr(strategy, "lightning_module", None), "global_step", None)
        state["saving"] = step == args.hang_save_at
        try:
            original_save_atomically(strategy, path, write)
        finally:
            state["saving"] = False

    def commit(staged: Path, target: Path) -> None:
        if state["saving"] and args.hang_after_files < 0:
            hang("before commit")
        original_commit(staged, target)

    original_write = AtomicCheckpointIO._write

    def write(io: Any, checkpoint: dict[str, Any], file: Any) -> None:
        if checkpoint.get("global_step") != args.hang_save_at:
            original_write(io, checkpoint, file)
            return
        import io as io_module

        buffer = io_module.BytesIO()
        original_write(io, checkpoint, buffer)
        data = buffer.getvalue()
        file.write(data[: len(data) // 2])
        file.flush()
        hang(f"half of {file.name} written")

    atomic_save.save_atomically = save_atomically  # the sharded strategies' saves call it from there
    atomic_commit.commit = commit  # every commit calls it as atomic_commit.commit
    AtomicCheckpointIO._write = write  # single-file saves (DDP)


def start_together(out: Path, wait_s: float = 600) -> None:
    """Let every rank enter the rendezvous at the same moment (test machinery, ``--start-together``).

    On a loaded machine a re-started rank can take longer to import torch and Lightning than the
    short timeouts of these tests; the rendezvous would then fail before the fault under test. Each
    rank announces itself in ``init_process_group`` and waits (bounded) for the others first.
    """
    import torch.distributed

    from lightning_anyaccel.cluster import rendezvous

    rendezvous.RENDEZVOUS_GRACE_S = wait_s  # the package's rendezvous deadline must not count this wait
    original = torch.distributed.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        rank, world_size = kwargs.get("rank", -1), kwargs.get("world_size", -1)
        if rank is None or int(rank) < 0:  # DeepSpeed passes -1: the launcher's variables say
            rank = os.environ.get("RANK")
        if world_size is None or int(world_size) < 0:
            world_size = os.environ.get("WORLD_SIZE")
        if rank is not None and world_size:
            world_size = int(world_size)
            (out / f"ready.{rank}").touch()
            end = time.monotonic() + wait_s
            while time.monotonic() < end and len(list(out.glob("ready.*"))) < world_size:
                time.sleep(0.05)
        return original(*args, **kwargs)

    torch.distributed.init_process_group = init_process_group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frontend", choices=("trainer", "fabric"), default="trainer")
    parser.add_argument("--strategy", choices=("ddp", "fsdp", "fsdp_full", "fsdp2", "deepspeed"), default="ddp")
    parser.add_argument("--start-method", choices=("popen", "spawn", "fork"), default="popen")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=10)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fault", choices=("none", "kill", "stop", "raise", "absent", "term", "sleep", "loader"),
                        default="none")
    parser.add_argument("--stall-timeout", type=float, default=None)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--fault-rank", type=int, default=1)
    parser.add_argument("--fault-step", type=int, default=2)
    parser.add_argument("--ckpt-dir", default=None)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--hang-save-at", type=int, default=None)
    parser.add_argument("--hang-after-files", type=int, default=1)
    parser.add_argument("--io", choices=("atomic", "direct"), default="atomic")
    parser.add_argument("--start-together", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fault == "absent" and "LOCAL_RANK" in os.environ and rank_of_process() == args.fault_rank:
        mark_fault(args, args.fault_rank, "stopping before the rendezvous")
        os.kill(os.getpid(), signal.SIGSTOP)
    if args.hang_save_at is not None:
        hang_during_saves(args, out)
    if args.start_together:
        start_together(out)
    torch.set_num_threads(1)
    L.seed_everything(1234, verbose=False)
    (run_trainer if args.frontend == "trainer" else run_fabric)(args, out)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
