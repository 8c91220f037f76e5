"""Lightning's batch-size finder on a device of small capacity, through the package, with both Lightning packages.

Run with the emulator loaded with a small capacity (docs/emulator.md):

    LIGHTNING_ANYACCEL_EMULATE=acme:1:memory=96MiB PYTHONPATH=src/lightning_anyaccel/kit/emulator/autoload:src \
        python tests/scripts/batch_size_finder.py

In power mode the finder doubles the batch size until a step runs out of device memory, then halves it
(Lightning recognises only CUDA's out-of-memory messages; the package teaches it every device's). Then the
model trains at the size found. Prints ``RESULT name: value`` lines; tests/test_device_rules.py asserts on them.
"""

from __future__ import annotations

import importlib
import warnings

import torch
from torch import nn

import lightning_anyaccel  # noqa: F401  (registers the package with both Lightning packages)
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.kit.tools.demo import demo_data

warnings.filterwarnings("ignore")
#: The samples of the data set: more than the largest batch tried (the finder stops at the data set's size).
SAMPLES = 1 << 14


def result(name: str, value: object) -> None:
    print(f"RESULT {name}: {value}", flush=True)


def wide_model(base: type) -> type:
    """A model whose activations take 48 KiB per sample (and little compute): memory grows with the batch."""

    class WideModel(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 64
            self.gain = nn.Parameter(torch.ones(16 * 256))
            self.head = nn.Linear(16 * 256, 1)
            self.tried: list[int] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.tried.append(len(x))
            wide = x.repeat(1, 256) * self.gain
            return nn.functional.mse_loss(self.head(wide), y)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(demo_data(n=SAMPLES), batch_size=self.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return WideModel


def main() -> None:
    device = torch.accelerator.current_accelerator()
    result("device", device)
    spec = get_spec(device.type)
    for package in ("lightning", "pytorch_lightning"):
        pl = importlib.import_module("lightning.pytorch" if package == "lightning" else "pytorch_lightning")
        tuner = importlib.import_module(f"{pl.__name__}.tuner")
        model = wide_model(pl.LightningModule)()
        trainer = pl.Trainer(accelerator="any", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
        ooms = runtime.memory_stats(spec, 0).get("num_ooms", 0)
        found = tuner.Tuner(trainer).scale_batch_size(model, mode="power", steps_per_trial=1, init_val=512,
                                                            max_trials=12)
        hit = runtime.memory_stats(spec, 0).get("num_ooms", 0) > ooms
        result(f"{package} batch size", found)
        result(f"{package} out of memory at", max(model.tried) if hit else "never")
        trainer.fit(model)
        result(f"{package} fit", "done" if trainer.global_step == 2 and model.tried[-1] == found else "incomplete")


if __name__ == "__main__":
    main()
