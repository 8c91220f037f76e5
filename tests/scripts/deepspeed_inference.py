"""``trainer.predict`` with DeepSpeed's inference engine (tensor parallel), as lightning-habana's users call it.

``AnyDeepSpeedStrategy(tensor_parallel={"tp_size": 2}, dtype=torch.float, replace_with_kernel_inject=False,
injection_policy={Block: ("mlp.out",)})`` (``--form kwargs``) or the same keys in ``config=`` (``--form config``),
two processes (popen DDP re-runs this file per rank). Every rank writes ``<out>/rank<N>.json``: the engine's
class, the shape of the layers it holds (split across the ranks), and its predictions next to those of the
unsplit model computed in the same process.

With ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives are marked unavailable (plain gloo,
no minute-long compile; see ``tests/scripts/shard_run.py``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning_anyaccel  # noqa: E402,F401  (registers names)
from lightning_anyaccel import AnyAccelerator, AnyDeepSpeedStrategy  # noqa: E402


class MLP(torch.nn.Module):
    """Two linear layers: ``inner`` is split by output features, ``out`` by input features and all-reduced."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.inner(x)))


class Block(torch.nn.Module):
    """The module ``injection_policy`` names; ``mlp.out`` is the layer whose partial results are all-reduced."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class Predictor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.block = Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self(batch[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--form", choices=("kwargs", "config"), default="kwargs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    inference = {"tensor_parallel": {"tp_size": 2}, "dtype": torch.float, "replace_with_kernel_inject": False,
                 "injection_policy": {Block: ("mlp.out",)}}
    strategy = AnyDeepSpeedStrategy(**inference) if args.form == "kwargs" else AnyDeepSpeedStrategy(config=inference)
    model = Predictor()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    expected = model(x).detach()
    trainer = L.Trainer(accelerator=AnyAccelerator("cpu"), strategy=strategy, devices=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    predictions = trainer.predict(model, DataLoader(TensorDataset(x), batch_size=3))
    engine = trainer.strategy.model
    record = {
        "rank": trainer.global_rank,
        "engine": type(engine).__name__,
        "inner_weight": list(model.block.mlp.inner.weight.shape),
        "predictions": torch.cat(predictions).tolist(),
        "expected": expected.tolist(),
    }
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
