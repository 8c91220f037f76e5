"""Preemption: a scheduler's ``SIGTERM`` (or SLURM's ``--signal`` warning) saves a checkpoint and ends cleanly.

Lightning's own handling (2.6) turns ``SIGTERM`` into an exception at the next batch without
saving anything, and its SLURM auto-requeue handler saves from inside the signal handler on
every rank and requeues. :class:`PreemptionCheckpoint` does it in three safe steps instead:

1. the signal handler only records the signal (and forwards it to the workers this process
   started, as Lightning does);
2. after every training batch all ranks agree (one tiny all-reduce) whether any of them was
   signalled, so they stop at the same step;
3. all ranks save ``<dirpath>/preempted.ckpt`` together (sharded strategies write their part;
   the save is atomic), the fit ends normally (exit status 0), and under SLURM rank 0 requeues
   the job when asked to (``requeue=True``).

A requeued (or restarted) run resumes with ``trainer.fit(model, ckpt_path=PreemptionCheckpoint.resume_path(dirpath))``.

Example:
    >>> PreemptionCheckpoint.resume_path("/nonexistent") is None
    True
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

log = logging.getLogger(__name__)

#: Signals a scheduler sends before it ends a job: SIGTERM (every scheduler), SIGUSR1 (SLURM's
#: usual ``--signal=USR1@<seconds>`` warning).
DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)

#: File name of the checkpoint written on preemption.
FILENAME = "preempted.ckpt"


class PreemptionCheckpoint(Callback):
    """Save a checkpoint and stop training when the job is told it will be ended.

    Args:
        dirpath: where ``preempted.ckpt`` is written (a shared file system for multi-node jobs).
        signals: the signals that mean "you are about to be ended".
        requeue: run ``scontrol requeue $SLURM_JOB_ID`` on rank 0 after saving. ``None``
            (default): only when the job runs under SLURM and ``SLURM_JOB_ID`` is set, and the
            signal was not ``SIGTERM`` (SLURM sends ``SIGTERM`` when it ends the job itself, and
            ``sbatch --requeue`` jobs are requeued by SLURM on preemption).
    """

    def __init__(self, dirpath: str | os.PathLike, signals: Iterable[int] = DEFAULT_SIGNALS,
                 requeue: bool | None = None) -> None:
        self.dirpath = Path(dirpath)
        self.signals = tuple(signal.Signals(s) for s in signals)
        self.requeue = requeue
        self.received: signal.Signals | None = None
        self.saved_at: int | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._trainer: Any = None

    @staticmethod
    def resume_path(dirpath: str | os.PathLike) -> str | None:
        """``<dirpath>/preempted.ckpt`` if a preempted run left it, else ``None`` (start afresh)."""
        path = Path(dirpath) / FILENAME
        return str(path) if path.exists() else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
            launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
            for proc in getattr(launcher, "procs", None) or []:  # workers this process started (popen)
                if proc.poll() is None:
                    proc.send_signal(signum)

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Install the handlers (after Lightning's signal connector installed its own)."""
        self._trainer = trainer
        self.received = None
        for signum in self.signals:
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread: leave signals to the caller
                return

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        name = self.received.name if self.received is not None else "a signal to another rank"
        path = self.dirpath / FILENAME
        log.warning("[lightning_anyaccel] rank %d: received %s; saving %s at step %d and stopping.",
                    trainer.global_rank, name, path, trainer.global_step)
        trainer.save_checkpoint(str(path))
        self.saved_at = trainer.global_step
        trainer.should_stop = True
        if trainer.is_global_zero and self._should_requeue():
            self._requeue()

    def _should_requeue(self) -> bool:
        if self.requeue is not None:
            return self.requeue
        return "SLURM_JOB_ID" in os.environ and self.received not in (None, signal.SIGTERM)

    @staticmethod
    def _requeue() -> None:
        job = os.environ.get("SLURM_JOB_ID", "")
        if os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        if result.returncode:
            log.error("[lightning_anyaccel] `scontrol requeue %s` failed: %s", job, result.stderr.strip())
        else:
            log.warning("[lightning_anyaccel] requeued SLURM job %s.", job)

    @override
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        for signum, handler in self._previous.items():
            try:
                signal.signal(signum, handler)
            except (ValueError, TypeError):
                pass
        self._previous = {}


__all__ = ["DEFAULT_SIGNALS", "FILENAME", "PreemptionCheckpoint"]
