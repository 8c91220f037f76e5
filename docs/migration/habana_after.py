"""lightning-habana -> lightning-anyaccel: the same Trainers on Intel Gaudi (``hpu``).

The Trainers as you build them for Gaudi; the fit, the data and the model stay as they are.
"""

import torch
import lightning_anyaccel  # noqa: F401  (registers "hpu", "any_ddp", ...; maps "ddp", "fsdp", ...)
from lightning import Trainer
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.profilers import PyTorchProfiler
from lightning_anyaccel import (
    AnyAccelerator,
    AnyDDPStrategy,
    AnyDeepSpeedStrategy,
    AnyFSDPStrategy,
    AnySingleDeviceStrategy,
)

# The README's forms are unchanged: one device -> any_single, several -> any_ddp (HCCL).
one = Trainer(accelerator="hpu", devices=1)
eight = Trainer(accelerator="hpu", devices=8)

# The classes, where a script names them
single = Trainer(accelerator=AnyAccelerator("hpu"), strategy=AnySingleDeviceStrategy(), devices=1)
parallel = Trainer(accelerator=AnyAccelerator("hpu"), strategy=AnyDDPStrategy(), devices=8, num_nodes=2)

# habana's parallel_devices list still works: unnumbered devices are numbered by local rank
parallel_hpus = [torch.device("hpu")] * 8
listed = Trainer(accelerator=AnyAccelerator("hpu"), devices=8, strategy=AnyDDPStrategy(parallel_devices=parallel_hpus))

# Sharded training: DeepSpeed ZeRO and FSDP, bf16 autocast on hpu
deepspeed = Trainer(accelerator="hpu", strategy=AnyDeepSpeedStrategy(stage=2), devices=8, precision="bf16-mixed")
fsdp = Trainer(accelerator="hpu", strategy=AnyFSDPStrategy(), devices=8, precision="bf16-mixed")

# Mixed precision is a precision name: no plugin to build
bf16 = Trainer(accelerator="hpu", devices=1, precision="bf16-mixed")

# 16-mixed as HPUPrecisionPlugin("16-mixed") trained: fp16 autocast without loss scaling
no_scaling = MixedPrecision("16-mixed", "hpu", scaler=torch.amp.GradScaler("hpu", enabled=False))
fp16 = Trainer(accelerator="hpu", devices=1, plugins=[no_scaling])

# DeepSpeed inference for trainer.predict: HPUDeepSpeedStrategy's keywords go to deepspeed.init_inference
inference_strategy = AnyDeepSpeedStrategy(
    tensor_parallel={"tp_size": 8}, dtype=torch.float, replace_with_kernel_inject=True
)
inference = Trainer(accelerator="hpu", devices=8, use_distributed_sampler=False, strategy=inference_strategy)

# HPUProfiler(...) -> Lightning's PyTorchProfiler(...): it records the Gaudi's own activity
profiled = Trainer(accelerator="hpu", devices=1, profiler=PyTorchProfiler(filename="perf-logs"))
