"""The Intel Aurora example -> lightning-anyaccel: ``pytorch_lightning`` Trainers on Intel GPUs (``xpu``).

No cluster environment, no ``init_process_group``, no precision plugin and no strategy class of
your own: under ``mpiexec`` the package reads the launcher's rank variables (AnyMPIEnvironment)
and joins the process group itself (xccl), with the layout checks and the rendezvous deadline.
The Trainers as you build them for Aurora; launch the script with ``mpiexec`` as before.
"""

import pytorch_lightning as pl

import lightning_anyaccel  # noqa: F401  (registers "xpu"; maps "ddp", "deepspeed_stage_2", ...)
from lightning_anyaccel.pytorch_lightning import AnyDeepSpeedStrategy

# MPIDDPStrategy -> Lightning's name
ddp = pl.Trainer(accelerator="xpu", strategy="ddp", devices=12, num_nodes=2, precision="bf16-mixed")

# XPUDeepSpeedStrategy -> Lightning's name, or the package's class for DeepSpeed's options
deepspeed = pl.Trainer(accelerator="xpu", strategy="deepspeed_stage_2", devices=12, num_nodes=2, precision="bf16-mixed")
strategy = AnyDeepSpeedStrategy(stage=2, offload_optimizer=True, logging_batch_size_per_gpu="auto")
offload = pl.Trainer(accelerator="xpu", strategy=strategy, devices=12, num_nodes=2, precision="bf16-mixed")
