"""Collectives as a device has them: asynchronous works, and a backend without ``ReduceOp.AVG``.

Run with the emulator's option ``noavg`` (docs/emulator.md); the Trainer starts the second process:

    LIGHTNING_ANYACCEL_EMULATE=acme:2:noavg PYTHONPATH=src/lightning_anyaccel/kit/emulator/autoload:src \\
        python tests/scripts/collectives_run.py

Each rank prints ``RESULT rank<r> <name>: <value>`` lines; tests/test_emulator.py asserts on them:
what ``torch.distributed`` gives before and after ``wait()``, the refusal of ``AVG``, and what the
package makes of a mean (``self.log(..., sync_dist=True)``, ``strategy.reduce``, ``fabric.all_reduce``)
and of FSDP2 (which reduce-scatters its gradients with ``AVG``) on such a backend.
"""

from __future__ import annotations

import hashlib
import sys
import warnings

import torch
import torch.distributed as dist
from lightning import Fabric, LightningModule, Trainer
from script_common import refusal
from torch import nn

import lightning_anyaccel  # noqa: F401

warnings.filterwarnings("ignore")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def result(name: str, value: object) -> None:
    sys.stdout.write(f"RESULT rank{dist.get_rank()} {name}: {value}\n")  # one write: the ranks share the pipe
    sys.stdout.flush()


def raw_collectives(device: torch.device) -> None:
    """``torch.distributed`` on the device: a result lands at ``wait()``, not when the call returns."""
    rank = dist.get_rank()
    t = torch.full((3,), float(rank + 1), device=device)
    work = dist.all_reduce(t, async_op=True)
    result("read before wait", t.cpu().tolist())  # a missing wait(): the old value
    work.wait()
    result("read after wait", t.cpu().tolist())
    f = torch.full((2,), float(rank + 1), device=device)
    result("future", [x.cpu().tolist() for x in dist.all_reduce(f, async_op=True).get_future().wait()])
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    first = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b, async_op=True).wait()
    result("issue order", [a.item(), first.is_completed()])  # waiting for the second completed the first
    result("avg", refusal(lambda: dist.all_reduce(torch.ones(1, device=device), op=dist.ReduceOp.AVG)))


class Logs(LightningModule):
    """DDP: synchronised gradients (DDP waits on its buckets' futures) and a logged mean."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def on_fit_start(self) -> None:
        raw_collectives(self.device)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.log("rank_value", float(self.global_rank + 1), sync_dist=True)  # the mean over ranks: 1.5
        return self.layer(batch).pow(2).mean()

    def on_train_end(self) -> None:
        reduced = self.trainer.strategy.reduce(torch.tensor(float(self.global_rank + 1), device=self.device))
        result("strategy.reduce mean", reduced.item())
        weights = b"".join(p.detach().cpu().numpy().tobytes() for p in self.parameters())
        result("ddp weights", hashlib.sha1(weights).hexdigest()[:12])

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        torch.manual_seed(self.global_rank)  # each rank its own data: only synchronised gradients keep weights equal
        return torch.utils.data.DataLoader(torch.randn(32, 4), batch_size=8)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Sharded(Logs):
    """FSDP2: every block sharded with ``fully_shard`` (its gradients are reduce-scattered with ``AVG``)."""

    def on_fit_start(self) -> None:
        pass

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def on_train_end(self) -> None:
        result("fsdp2 steps", self.trainer.global_step)


def main() -> None:
    trainer = Trainer(accelerator="any", devices=2, strategy="any_ddp", max_steps=3, **QUIET)
    trainer.fit(Logs())
    result("logged mean", trainer.callback_metrics["rank_value"].item())
    trainer = Trainer(accelerator="any", devices=2, strategy="any_fsdp2", max_steps=2, **QUIET)
    result("fsdp2", refusal(lambda: trainer.fit(Sharded())))
    fabric = Fabric(accelerator="any", devices=2, strategy="any_ddp")
    fabric.launch()
    result("fabric.all_reduce mean", fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1), device=fabric.device),
                                                       reduce_op="mean").item())


if __name__ == "__main__":
    main()
