"""What the notebooks of the tutorial share: the model and data, and plumbing.

- The model and data (``DigitsCNN``, ``DigitsDataModule``, ``digits_splits``) and the throughput
  callback (``EpochTimer``) are what the notebooks teach with: notebook 2 prints the model and
  the data module, notebook 3 the training script and ``EpochTimer``. They live here because the
  training script ``scripts/train_digits.py`` uses them too.
- Everything else is plumbing, not part of the lesson: running commands with timeouts
  (``run_bounded``, ``run_together``, ``free_port``, ``child_env``), HTML tables for the outputs
  (``html_table``), quieter logs (``quiet_lightning``) and ``accuracy``.

Nothing here knows about a device: the notebooks pick it with ``AnyAccelerator()`` and the
package's device table answers every device-specific question. The data set is scikit-learn's
``digits`` (1,797 real 8x8 handwritten digits shipped inside the scikit-learn wheel: no
download), split once with a fixed seed into train / validation / held-out test sets.
"""

from __future__ import annotations

import html
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------------------------------------
# data


def digits_splits(seed: int = 0) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train (70 %), validation (15 %) and held-out test (15 %) sets of scikit-learn's digits.

    Images are ``float32`` tensors of shape ``(1, 8, 8)`` scaled to ``[0, 1]``; the split is
    stratified and fixed by ``seed``, so every process and every run sees the same sets.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    idx = list(range(len(y)))
    train_idx, rest_idx = train_test_split(idx, test_size=0.3, random_state=seed, stratify=y.numpy())
    val_idx, test_idx = train_test_split(rest_idx, test_size=0.5, random_state=seed, stratify=y[rest_idx].numpy())
    return tuple(TensorDataset(x[i], y[i]) for i in (train_idx, val_idx, test_idx))  # type: ignore[return-value]


class DigitsDataModule(L.LightningDataModule):
    """The digits splits as a ``LightningDataModule``.

    ``batch_size`` is the batch **per process**. Under DDP, Lightning gives every process a
    ``DistributedSampler`` over the training set, so each process sees ``1 / world_size`` of it
    and the global batch is ``batch_size * world_size``.
    """

    def __init__(self, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed

    def setup(self, stage: str | None = None) -> None:
        self.train_set, self.val_set, self.test_set = digits_splits(self.seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


# ----------------------------------------------------------------------------------------------
# model


class DigitsCNN(L.LightningModule):
    """A small CNN for 8x8 digits: two 3x3 convolutions, max-pooling, one linear layer.

    Logs ``train_loss``/``train_acc`` per step and epoch, ``val_loss``/``val_acc`` and
    ``test_acc`` per epoch, all averaged over processes (``sync_dist=True``).
    """

    def __init__(self, lr: float = 0.01, channels: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),                               # 8x8 -> 4x4
            nn.Flatten(),
            nn.Linear(channels * 16, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _step(self, batch: Any, stage: str) -> torch.Tensor:
        x, y = batch
        logits = self(x).float()                           # float32 loss under mixed precision too
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=on_step, on_epoch=True, sync_dist=True)
        self.log(f"{stage}_acc", acc, on_step=on_step, on_epoch=True, sync_dist=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train")

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def accuracy(model: nn.Module, dataset: TensorDataset) -> float:
    """Accuracy of ``model`` on ``dataset``, computed on the model's current device."""
    device = next(model.parameters()).device
    x, y = dataset.tensors
    model.eval()
    with torch.no_grad():
        pred = model(x.to(device)).argmax(dim=1).cpu()
    return float((pred == y).float().mean())


# ----------------------------------------------------------------------------------------------
# throughput


class EpochTimer(Callback):
    """Measures training throughput (samples per second over all processes) per epoch.

    The device is synchronised before each clock reading through ``torch.accelerator`` (a
    no-op without an accelerator), so queued device work is counted in the epoch it belongs to.
    The first epoch includes warm-up; report the later ones.
    """

    def __init__(self) -> None:
        self.samples_per_s: list[float] = []        # all processes together
        self.local_samples_per_s: list[float] = []  # this process alone
        self.epoch_s: list[float] = []

    @staticmethod
    def _sync(trainer: L.Trainer) -> None:
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type == trainer.strategy.root_device.type:
            torch.accelerator.synchronize()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        self._start = time.perf_counter()
        self._samples = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._samples += len(batch[0])

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sync(trainer)
        seconds = time.perf_counter() - self._start
        total = trainer.strategy.reduce(torch.tensor(float(self._samples)), reduce_op="sum")
        self.epoch_s.append(seconds)
        self.samples_per_s.append(float(total) / seconds)
        self.local_samples_per_s.append(self._samples / seconds)


# ----------------------------------------------------------------------------------------------
# processes: every wait is bounded


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(**extra: Any) -> dict[str, str]:
    """The environment for a child process: this one's, one thread per process, plus ``extra``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.update({key: str(value) for key, value in extra.items()})
    return env


def run_bounded(cmd: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> str:
    """Run ``cmd``, return its output; kill its whole process group if it runs past ``timeout``."""
    proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise RuntimeError(f"{' '.join(cmd)} did not finish in {timeout:.0f} s:\n{out[-3000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{out[-3000:]}")
    return out


def run_together(jobs: dict[str, tuple[Sequence[str], dict[str, str]]], *, timeout: float,
                 log_dir: Path, cwd: Path | None = None) -> dict[str, str]:
    """Start several commands at once (one per "node"), each logging to ``log_dir/<name>.log``.

    Waits for all of them, at most ``timeout`` seconds in total; on timeout or failure every
    process group is killed and the logs are shown in the error. Returns the logs by name.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, files = {}, {}
    for name, (cmd, env) in jobs.items():
        files[name] = open(log_dir / f"{name}.log", "w")
        procs[name] = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=files[name], stderr=subprocess.STDOUT,
                                       start_new_session=True)
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for name, proc in procs.items():
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                failed.append(f"{name}: {'timed out' if code is None else f'exit code {code}'}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for handle in files.values():
            handle.close()
    logs = {name: (log_dir / f"{name}.log").read_text() for name in jobs}
    if failed:
        shown = "\n".join(f"--- {name}.log\n{text[-2000:]}" for name, text in logs.items())
        raise RuntimeError(f"{'; '.join(failed)}\n{shown}")
    return logs


# ----------------------------------------------------------------------------------------------
# display


def html_table(rows: Iterable[Sequence[Any]], header: Sequence[str]) -> Any:
    """An HTML table for Jupyter (and the documentation site) from plain rows."""
    from IPython.display import HTML

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(cell))}</td>" for cell in row) + "</tr>" for row in rows
    )
    return HTML(f'<table class="anyaccel-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def quiet_lightning() -> None:
    """Keep Lightning's per-fit info lines ("GPU available: False", ...) out of the output."""
    import logging
    import warnings

    for name in ("lightning.pytorch", "lightning.fabric", "lightning_anyaccel"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # a 1,257-sample data set needs no loader workers; Lightning suggests them for every loader
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # noise from lightning 2.6 with torch 2.13 and from machines that have SLURM installed
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", message=".*The `srun` command is available.*")
    # verify's 4-step fit uses a model with a validation_step and no validation data, on purpose
    warnings.filterwarnings("ignore", message=".*but have no `val_dataloader`.*")


__all__ = [
    "DigitsCNN", "DigitsDataModule", "EpochTimer", "accuracy", "child_env", "digits_splits", "free_port",
    "html_table", "quiet_lightning", "run_bounded", "run_together", "HERE",
]
