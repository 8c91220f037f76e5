"""Lightning's built-in ``accelerator="gpu"`` -> ``accelerator="any"``: the same script on every device.

``"any"`` is the device ``torch.accelerator`` reports (CUDA, XPU, HPU, NPU, ...), else the CPU.
Trains for real (2 processes on CPU).
"""

import sys

from lightning import Trainer

import lightning_anyaccel  # noqa: F401  (registers "any"; maps "ddp" to the package's DDP)
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

trainer = Trainer(accelerator="any", devices=2, strategy="ddp", precision="bf16-mixed", max_epochs=4)

model = DemoModel()
trainer.fit(model, demo_loader())
half = len(model.losses) // 2  # mean loss of the first and of the second half of training
first, second = sum(model.losses[:half]) / half, sum(model.losses[half:]) / (len(model.losses) - half)
print(f"rank {trainer.global_rank}: {type(trainer.strategy).__name__} on {trainer.strategy.root_device},"
      f" loss {first:.3f} -> {second:.3f}", file=sys.stderr)
