"""``trainer.fit`` under ``AnyDeepSpeedStrategy`` of a model whose ``configure_optimizers`` returns ``None``.

One process on CPU, ZeRO stage 2: the fit must stop with Lightning's ``MisconfigurationException`` naming
the invalid optimizer (as lightning-habana's ``HPUDeepSpeedStrategy`` does), not with DeepSpeed's
``IndexError`` from an optimizer without parameters. Prints ``refused: <message>`` and exits 0 when it is
refused that way; any other outcome propagates (a traceback, a non-zero exit).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
if os.environ.get("ANYACCEL_DS_NO_SHM") == "1":  # no minute-long compile of a CPU-only op (shard_run.py)
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

import lightning as L  # noqa: E402
from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from lightning_anyaccel import AnyAccelerator, AnyDeepSpeedStrategy  # noqa: E402


class NoOptimizer(BoringModel):
    def configure_optimizers(self) -> None:
        return None


if __name__ == "__main__":
    trainer = L.Trainer(accelerator=AnyAccelerator("cpu"), strategy=AnyDeepSpeedStrategy(stage=2), devices=1,
                        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    try:
        trainer.fit(NoOptimizer())
    except MisconfigurationException as refused:
        print(f"refused: {refused}")
    else:
        raise SystemExit("the fit ran without an optimizer")
