"""A device nobody described, on a backend that lacks what some vendors' backends lack: what the package does.

Run with the emulator loaded as ``acme`` (a name in no table and no code of the package) and the
options ``noshallow,noautocast,nocollectives`` (docs/emulator.md):

    LIGHTNING_ANYACCEL_EMULATE=acme:2:noshallow,noautocast,nocollectives PYTHONPATH=src/lightning_anyaccel/kit/emulator/autoload:src \
        python tests/scripts/lesser_backend.py

Each section trains or is refused for real on the emulated device, and prints one ``RESULT name: value``
line; tests/test_emulator.py asserts on them. Nothing here registers or describes the device.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch
from lightning import Fabric, LightningModule, Trainer
from script_common import refusal
from torch import nn

import lightning_anyaccel  # noqa: F401  (the only package line: no register_device, no DeviceSpec)
from lightning_anyaccel.kit import verify

warnings.filterwarnings("ignore")
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)


def result(name: str, value: object) -> None:
    print(f"RESULT {name}: {value}", flush=True)


def plain_torch_trains_nothing() -> None:
    """The failure the package prevents: on this backend, an optimizer built before ``.to(device)`` steps nothing."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to("acme")
    before = model.weight.detach().cpu().clone()
    model(torch.randn(8, 4, device="acme")).pow(2).mean().backward()
    optimizer.step()
    result("plain torch weights unchanged", torch.equal(before, model.weight.detach().cpu()))


def fabric_setup_repoints_the_optimizer() -> None:
    """``fabric.setup(model, optimizer)`` with an optimizer built on the CPU parameters (the usual order)."""
    fabric = Fabric(accelerator="any", devices=1)
    model = nn.Linear(4, 1)
    cpu_weight = model.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    result("fabric replaced", model.weight is not cpu_weight)  # the backend really replaced the parameter
    before = model.weight.detach().cpu().clone()
    for _ in range(3):
        loss = model(torch.randn(8, 4, device=fabric.device)).pow(2).mean()
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    held = [p for group in optimizer.param_groups for p in group["params"]]
    result("fabric optimizer params", sorted({str(p.device) for p in held}))
    result("fabric optimizer holds the model's", all(any(p is q for q in model.parameters()) for p in held))
    result("fabric momentum on", sorted({str(s["momentum_buffer"].device) for s in optimizer.state.values()}))
    result("fabric weights changed", not torch.equal(before, model.weight.detach().cpu()))


def fabric_setup_optimizers_after_setup_module() -> None:
    """An optimizer built before ``setup_module`` and set up after: re-pointed; one over other tensors: refused."""
    fabric = Fabric(accelerator="any", devices=1)
    model = nn.Linear(4, 1)
    early = torch.optim.Adam(model.parameters())
    module = fabric.setup_module(model)
    early = fabric.setup_optimizers(early)
    result("setup_module then optimizer", all(p.device == fabric.device for g in early.param_groups for p in g["params"]))
    stranger = torch.optim.SGD(nn.Linear(4, 1).parameters(), lr=0.1)
    result("foreign optimizer", refusal(lambda: fabric.setup_optimizers(stranger)))
    del module


class EarlyOptimizer(LightningModule):
    """Builds its optimizer in ``__init__``, from the CPU parameters (a common Lightning pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.parameters(), lr=0.5)
        self.initial = self.layer.weight.detach().clone()
        self.seen: set[str] = set()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        held = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.seen |= {f"{p.device}:{'model' if any(p is q for q in self.parameters()) else 'stale'}" for p in held}
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.optimizer


def trainer_repoints_an_early_optimizer() -> None:
    model = EarlyOptimizer()
    trainer = Trainer(accelerator="acme", devices=1, max_steps=3, **QUIET)
    trainer.fit(model, torch.utils.data.DataLoader(torch.randn(24, 4), batch_size=8))
    result("trainer optimizer params in training_step", sorted(model.seen))
    result("trainer weights changed", not torch.equal(model.initial, model.layer.weight.detach().cpu()))


def refusals() -> None:
    result("two devices", refusal(lambda: Trainer(accelerator="acme", devices=2, **QUIET)))
    from lightning_anyaccel import AnyDDPStrategy

    result("gloo", refusal(lambda: Trainer(accelerator="acme", devices=2, **QUIET,
                                           strategy=AnyDDPStrategy(process_group_backend="gloo"))))
    result("bf16", refusal(lambda: Trainer(accelerator="acme", devices=1, precision="bf16-mixed", **QUIET)))
    # no accelerator given: the automatic choice finds acme and refuses what it can not do, as accelerator="any" does
    result("auto two devices", refusal(lambda: Trainer(**QUIET)))
    result("auto fabric two devices", refusal(lambda: Fabric()))
    result("any fabric two devices", refusal(lambda: Fabric(accelerator="any")))
    result("auto bf16", refusal(lambda: Trainer(devices=1, precision="bf16-mixed", **QUIET)))
    result("auto fabric bf16", refusal(lambda: Fabric(devices=1, precision="bf16-mixed").launch()))
    result("any fabric bf16", refusal(lambda: Fabric(accelerator="any", devices=1, precision="bf16-mixed").launch()))


def verify_report() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = verify.main([])
    result("verify status", status)
    print(out.getvalue())


if __name__ == "__main__":
    result("device", torch.accelerator.current_accelerator())
    plain_torch_trains_nothing()
    fabric_setup_repoints_the_optimizer()
    fabric_setup_optimizers_after_setup_module()
    trainer_repoints_an_early_optimizer()
    refusals()
    verify_report()
