"""Workloads shared by the benchmarks: an MLP ``LightningModule``, its data, a step timer, a plain loop.

The same :class:`BenchModule` and data are used by the Lightning runs and by :func:`plain_loop`,
which does exactly the work of Lightning's automatic optimisation (forward, loss, backward,
``optimizer.step``, ``zero_grad(set_to_none=True)``) without the Trainer.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.common import now, synchronize


@dataclass(frozen=True)
class Workload:
    """An MLP training job: ``layers`` hidden layers of width ``width``, batches of ``batch`` samples."""

    name: str
    features: int
    width: int
    layers: int
    batch: int
    classes: int = 10

    @property
    def params(self) -> int:
        """Number of trainable parameters."""
        dims = [self.features] + [self.width] * self.layers + [self.classes]
        return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))

    def describe(self) -> dict[str, Any]:
        """The workload as JSON: its sizes, parameter count and gradient bytes per step (fp32)."""
        return {**asdict(self), "params": self.params, "grad_bytes": 4 * self.params}


#: Overhead benchmark: a few ms per step on one CPU thread, so per-step framework cost shows.
OVERHEAD = Workload("overhead-mlp", features=256, width=512, layers=2, batch=64)
#: Compute-bound DDP: ~1 M parameters (4 MB of gradients), large batch.
COMPUTE_BOUND = Workload("compute-bound", features=512, width=512, layers=4, batch=256)
#: Communication-bound DDP: ~17 M parameters (67 MB of gradients), tiny batch.
COMM_BOUND = Workload("comm-bound", features=2048, width=2048, layers=4, batch=4)

WORKLOADS: dict[str, Workload] = {w.name: w for w in (OVERHEAD, COMPUTE_BOUND, COMM_BOUND)}


def scaled(workload: Workload, factor: float) -> Workload:
    """A smaller copy of ``workload`` (for ``--quick`` and the smoke test): width and batch scaled."""
    return Workload(
        workload.name, features=max(8, int(workload.features * factor)), width=max(8, int(workload.width * factor)),
        layers=workload.layers, batch=max(2, int(workload.batch * factor)), classes=workload.classes,
    )


def build_net(w: Workload) -> torch.nn.Sequential:
    """The MLP: ``Linear -> ReLU`` per hidden layer, then a linear classifier."""
    dims = [w.features] + [w.width] * w.layers
    layers: list[torch.nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(dims[-1], w.classes))
    return torch.nn.Sequential(*layers)


def make_loader(w: Workload, steps: int, seed: int = 0) -> DataLoader:
    """``steps`` batches of random inputs and labels, in memory (no workers, no shuffling)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * w.batch, w.features, generator=g)
    y = torch.randint(0, w.classes, (steps * w.batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=w.batch)


class BenchModule(LightningModule):
    """The benchmark model: an MLP trained with cross-entropy and SGD; nothing logged per step."""

    def __init__(self, workload: Workload, lr: float = 0.01) -> None:
        super().__init__()
        self.workload = workload
        self.lr = lr
        self.net = build_net(workload)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class StepTimer(Callback):
    """Times training steps ``warmup .. warmup+measure-1`` (device synchronised at both ends).

    ``steps_per_s`` is ``measure / elapsed`` (wall clock); ``cpu_steps_per_s`` divides by the CPU
    time this process used instead, which other processes on a shared machine barely disturb.
    ``first_step_done`` is the wall-clock time
    (``time.time()``) at the end of the first step, for the time-to-first-step benchmark.
    """

    def __init__(self, warmup: int, measure: int) -> None:
        self.warmup = warmup
        self.measure = measure
        self._start: float | None = None
        self._cpu_start = 0.0
        self.elapsed: float | None = None
        self.cpu_elapsed: float | None = None
        self.setup_done: float | None = None
        self.first_step_done: float | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.setup_done = time.time()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            synchronize(pl_module.device)
            self._start = now()
            self._cpu_start = time.process_time()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            synchronize(pl_module.device)
            self.first_step_done = time.time()
        if batch_idx == self.warmup + self.measure - 1 and self._start is not None:
            synchronize(pl_module.device)
            self.elapsed = now() - self._start
            self.cpu_elapsed = time.process_time() - self._cpu_start

    @property
    def steps_per_s(self) -> float:
        """Measured steps per second (raises if the measured window did not complete)."""
        if not self.elapsed:
            raise RuntimeError("StepTimer: the measured steps did not run (too few batches?)")
        return self.measure / self.elapsed

    @property
    def cpu_steps_per_s(self) -> float:
        """Measured steps per CPU-second of this process."""
        if not self.cpu_elapsed:
            raise RuntimeError("StepTimer: the measured steps did not run (too few batches?)")
        return self.measure / self.cpu_elapsed



class ProfiledSteps(StepTimer):
    """Profiles the measured steps (``warmup .. warmup+measure-1``) with ``cProfile`` instead of timing them."""

    def __init__(self, warmup: int, measure: int) -> None:
        super().__init__(warmup, measure)
        self.profile = cProfile.Profile()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.profile.enable()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup + self.measure - 1:
            self.profile.disable()

    @property
    def calls_per_step(self) -> float:
        """Function calls (Python and C, as ``cProfile`` counts them) per measured step."""
        return pstats.Stats(self.profile).total_calls / self.measure  # type: ignore[attr-defined]  # set by Stats.load_stats, not declared

def plain_loop(w: Workload, device: torch.device, warmup: int, measure: int, seed: int = 0,
               profile: Any = None) -> tuple[float, float]:
    """(steps per second, steps per CPU-second) of a hand-written loop doing :class:`BenchModule`'s work.

    ``profile`` (a ``cProfile.Profile``) is enabled for the measured steps only.
    """
    torch.manual_seed(seed)
    model = BenchModule(w).to(device)
    model.train()
    optimizer = model.configure_optimizers()
    start = cpu_start = 0.0
    for i, (x, y) in enumerate(make_loader(w, warmup + measure, seed)):
        if i == warmup:
            synchronize(device)
            start = now()
            cpu_start = time.process_time()
            if profile is not None:
                profile.enable()
        x, y = x.to(device), y.to(device)
        loss = model.training_step((x, y), i)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if profile is not None:
        profile.disable()
    synchronize(device)
    return measure / (now() - start), measure / (time.process_time() - cpu_start)
