"""The DDP options users set on ``AnyDDPStrategy`` reach the ``DistributedDataParallel`` module.

``AnyDDPStrategy`` passes unknown keyword arguments to DDP like Lightning's ``DDPStrategy`` and
registers ``ddp_comm_hook`` on every device type (Lightning does it on CUDA only). A real
2-process fit (gloo; fork, the quickest launcher: the options' path does not depend on it)
checks, in every rank, that the wrapped module carries the options (each differs from DDP's
default), that the comm hook ran on the gradient all-reduces, and that both ranks end with the
same weights. The benchmarks measure the options' effect (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import run_python

SCRIPT = '''
import json, sys
from pathlib import Path

import torch
from lightning import Trainer, LightningModule, Callback
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy

OUT = Path(sys.argv[1])
HOOK_CALLS = []


def counting_fp16_hook(state, bucket):
    HOOK_CALLS.append(bucket.buffer().numel())
    return default_hooks.fp16_compress_hook(state, bucket)


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Inspect(Callback):
    """Records, in each worker, what the DDP module carries and what the fit did."""

    def on_train_start(self, trainer, pl_module):
        ddp = trainer.strategy.model
        self.seen = {
            "is_ddp": isinstance(ddp, DistributedDataParallel),
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "static_graph": ddp.static_graph,
            "bucket_bytes_cap": ddp.bucket_bytes_cap,
            "hooks": [getattr(hook, "__name__", repr(hook)) for hook, _ in ddp._comm_hooks],
        }

    def on_train_end(self, trainer, pl_module):
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"rank{trainer.global_rank}.json").write_text(json.dumps({
            **self.seen, "hook_calls": len(HOOK_CALLS), "losses": pl_module.losses,
            "weights": [p.detach().double().sum().item() for p in pl_module.parameters()],
            "strategy": type(trainer.strategy).__name__,
        }))


if __name__ == "__main__":
    torch.manual_seed(0)
    strategy = AnyDDPStrategy(start_method="fork", gradient_as_bucket_view=True, static_graph=True, bucket_cap_mb=2,
                              ddp_comm_hook=counting_fp16_hook)
    trainer = Trainer(accelerator=AnyAccelerator(), strategy=strategy, devices=2, max_steps=4,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Inspect()])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(128, 32, generator=g), torch.randint(0, 4, (128,), generator=g))
    trainer.fit(Net(), DataLoader(data, batch_size=16))
'''


@pytest.mark.slow
def test_ddp_options_reach_the_ddp_module(tmp_path: Path) -> None:
    script = tmp_path / "knobs_fit.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    proc = run_python([str(script), str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:  # DDP's defaults are False, False, 25 MiB and no hook
        assert rank["strategy"] == "AnyDDPStrategy" and rank["is_ddp"]
        assert rank["gradient_as_bucket_view"] is True
        assert rank["static_graph"] is True
        assert rank["bucket_bytes_cap"] == 2 * 2**20
        assert rank["hooks"] == ["counting_fp16_hook"]
        assert rank["hook_calls"] >= 4, rank  # every step's gradients went through the hook
        assert len(rank["losses"]) == 4 and all(math.isfinite(x) for x in rank["losses"])
    # different samples per rank (distributed sampler), same weights after every all-reduce: the hooked all-reduce synchronised them
    assert ranks[0]["losses"] != ranks[1]["losses"]
    assert ranks[0]["weights"] == pytest.approx(ranks[1]["weights"], rel=1e-6, abs=1e-6)
