"""lightning-teco -> lightning-anyaccel: the same Trainers on Teco SDAA (``sdaa``, torch_sdaa).

The Trainers as you build them for SDAA; the fit, the data and the model stay as they are.
"""

import lightning_anyaccel  # noqa: F401  (registers "sdaa", "any_ddp", ...)
from lightning import Trainer
from lightning.pytorch.profilers import PyTorchProfiler
from lightning_anyaccel import AnyAccelerator, AnyDDPStrategy

# Run on one SDAA.
one = Trainer(accelerator=AnyAccelerator("sdaa"), devices=1)
# Run on multiple SDAAs.
several = Trainer(accelerator=AnyAccelerator("sdaa"), devices=8)
# The strategy class, where a script names it
ddp = Trainer(accelerator=AnyAccelerator("sdaa"), strategy=AnyDDPStrategy(), devices=8, precision="bf16-mixed")
# SDAAProfiler() -> Lightning's PyTorchProfiler(): it records the SDAA's own activity where torch_sdaa lets torch
profiled = Trainer(accelerator=AnyAccelerator("sdaa"), devices=1, profiler=PyTorchProfiler())
