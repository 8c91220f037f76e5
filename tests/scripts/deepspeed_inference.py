"""``trainer.predict`` with DeepSpeed's inference engine (tensor parallel), as lightning-habana's users call it.

``AnyDeepSpeedStrategy(tensor_parallel={"tp_size": 2}, dtype=..., replace_with_kernel_inject=False,
injection_policy={Block: ("mlp.out",)})``, two processes (popen DDP re-runs this file per rank). ``--runs``
names one or more predictions, comma-separated, each ``FORM:PRECISION:DTYPE``: the inference keys as keyword
arguments (``kwargs``) or in ``config=`` (``config``), the Trainer's ``precision``, the engine's ``dtype``
(``float32``, ``bfloat16``; DeepSpeed's CPU accelerator refuses ``float16`` on most CPUs). They run one after
the other in the same processes, each with a new model and Trainer. For each, every rank writes
``<out>/<FORM>-<PRECISION>-<DTYPE>/rank<N>.json``: the engine's class, the shape of the layers it holds (split
across the ranks), its predictions and their dtype, and the predictions of the unsplit model computed in the
same process, in the engine's dtype, on the same inputs (which Lightning's precision plugin rounds to
bfloat16 under ``bf16-mixed``).

With ``ANYACCEL_DS_NO_SHM=1`` DeepSpeed's shared-memory CPU collectives are marked unavailable (plain gloo,
no minute-long compile; see ``tests/scripts/shard_run.py``).
"""

from __future__ import annotations

import argparse
import copy
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


def predict(form: str, precision: str, dtype_name: str, out: Path) -> None:
    """One ``trainer.predict`` through DeepSpeed's inference engine; writes this rank's record to ``out``."""
    dtype = getattr(torch, dtype_name)
    inference = {"tensor_parallel": {"tp_size": 2}, "dtype": dtype, "replace_with_kernel_inject": False,
                 "injection_policy": {Block: ("mlp.out",)}}
    strategy = AnyDeepSpeedStrategy(**inference) if form == "kwargs" else AnyDeepSpeedStrategy(config=inference)
    model = Predictor()
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    # what the unsplit model computes in the engine's dtype, from the inputs Lightning's precision gives it
    given = x.to(torch.bfloat16) if precision == "bf16-mixed" else x
    expected = copy.deepcopy(model).to(dtype)(given.to(dtype)).detach()
    trainer = L.Trainer(accelerator=AnyAccelerator("cpu"), strategy=strategy, devices=2, precision=precision,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False)
    predictions = torch.cat(trainer.predict(model, DataLoader(TensorDataset(x), batch_size=3)))
    record = {
        "rank": trainer.global_rank,
        "engine": type(trainer.strategy.model).__name__,
        "inner_weight": list(model.block.mlp.inner.weight.shape),
        "dtype": str(predictions.dtype),
        "predictions": predictions.float().tolist(),
        "expected": expected.float().tolist(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="kwargs:32-true:float32",
                        help="comma-separated FORM:PRECISION:DTYPE (FORM: kwargs or config)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for run in args.runs.split(","):
        form, precision, dtype_name = run.split(":")
        predict(form, precision, dtype_name, Path(args.out, run.replace(":", "-")))


if __name__ == "__main__":
    main()
