"""A short real fit through each Lightning front end installed: ``lightning`` and ``pytorch_lightning``.

``make test-compat`` runs this file (with the contract test) in the environment of each end of the
supported Lightning range. ``ANYACCEL_FRONTEND=lightning`` or ``=pytorch_lightning`` picks one
front end; unset, every installed one runs (``lightning`` requires ``pytorch-lightning``, so a normal
install has both, as separate copies with separate registries).

Run as a script, the file is the DDP training program (Lightning's ``popen`` launcher re-runs it for
rank 1) and writes what each rank saw to ``<out>/rank<N>.json``. It is written as the vendor READMEs'
first example: ``Trainer(accelerator="any", devices=2)``, no strategy; the package must pick its DDP.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

FRONTEND_PACKAGES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
#: where the DDP strategy the package picks for each front end is defined
DDP_MODULES = {"lightning": "lightning_anyaccel.strategies.ddp", "pytorch_lightning": "lightning_anyaccel.pytorch_lightning"}


def frontends() -> list[str]:
    """The front ends to test: ``$ANYACCEL_FRONTEND``, else every installed one."""
    chosen = os.environ.get("ANYACCEL_FRONTEND")
    if chosen:
        if chosen not in FRONTEND_PACKAGES:
            raise ValueError(f"ANYACCEL_FRONTEND={chosen!r}: use one of {sorted(FRONTEND_PACKAGES)}")
        return [chosen]
    return [name for name in FRONTEND_PACKAGES if importlib.util.find_spec(name) is not None]


def load_frontend(name: str) -> ModuleType:
    """``lightning.pytorch`` or ``pytorch_lightning``, after the package registered its names."""
    import lightning_anyaccel  # noqa: F401  (registers the names)

    return importlib.import_module(FRONTEND_PACKAGES[name])


def make_model(pl: ModuleType) -> Any:
    """A tiny regression MLP built on the front end's own ``LightningModule``."""

    class TinyModel(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
            self.losses: list[float] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return TinyModel()


def make_loader() -> DataLoader:
    """A fixed regression data set (``y = X @ w``), 8 batches of 16."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=16)


def fit(pl: ModuleType, strategy: str, devices: int, steps: int) -> tuple[Any, Any]:
    """Fit the tiny model for ``steps`` steps with ``accelerator="any"`` and ``strategy`` (``"auto"``: none given)."""
    torch.manual_seed(0)
    model = make_model(pl)
    trainer = pl.Trainer(
        accelerator="any", strategy=strategy, devices=devices, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, make_loader())
    return trainer, model


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in module.state_dict().values():
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> None:
    """The DDP program: fit on 2 processes (no strategy unless ``--strategy``), one JSON file per rank."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--frontend", choices=sorted(FRONTEND_PACKAGES), required=True)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    pl = load_frontend(args.frontend)
    trainer, model = fit(pl, args.strategy, devices=2, steps=8)  # 2 epochs: 4 batches per rank
    import torch.distributed as dist

    record = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "strategy": type(trainer.strategy).__name__,
        "strategy_module": type(trainer.strategy).__module__,
        "environment": type(trainer.strategy.cluster_environment).__name__,
        "losses": model.losses,
        "trainer_module": type(trainer).__module__,
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "digest": _digest(model),
    }
    Path(args.out, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
else:
    import pytest

    @pytest.fixture(params=frontends() or [None], ids=lambda name: str(name))
    def frontend(request: pytest.FixtureRequest) -> str:
        if request.param is None:
            pytest.fail("neither lightning nor pytorch_lightning is installed")
        return request.param

    def test_names_registered_in_the_front_ends_registries(frontend: str) -> None:
        pl = load_frontend(frontend)
        accelerators = importlib.import_module(f"{FRONTEND_PACKAGES[frontend]}.accelerators").AcceleratorRegistry
        strategies = importlib.import_module(f"{FRONTEND_PACKAGES[frontend]}.strategies").StrategyRegistry
        assert "any" in accelerators, f"{pl.__name__} {pl.__version__}: accelerator 'any' not registered"
        for name in ("any_single", "any_ddp", "any_ddp_spawn"):
            assert name in strategies, f"{pl.__name__} {pl.__version__}: strategy {name!r} not registered"

    def test_single_device_fit(frontend: str) -> None:
        pl = load_frontend(frontend)
        trainer, model = fit(pl, "any_single", devices=1, steps=6)
        assert isinstance(trainer, pl.Trainer)
        assert type(trainer.strategy).__name__ == "AnySingleDeviceStrategy"
        assert trainer.global_step == 6
        assert model.losses[-1] < model.losses[0], model.losses

    @pytest.mark.slow
    def test_ddp_two_processes(frontend: str, tmp_path: Path, python_runner: Any) -> None:
        result = python_runner([__file__, "--frontend", frontend, "--out", str(tmp_path)], timeout=240)
        assert result.returncode == 0, result.stdout[-4000:]
        records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
        for rank, record in enumerate(records):
            assert record["rank"] == rank and record["world_size"] == 2, record
            assert record["global_step"] == 8 and record["strategy"] == "AnyDDPStrategy", record
            assert record["strategy_module"] == DDP_MODULES[frontend], record  # the front end's own port
            assert record["environment"] == "LightningEnvironment", record  # started by Lightning (popen)
            first, second = record["losses"][:4], record["losses"][4:]  # the same 4 batches, epoch 1 and 2
            assert sum(second) < sum(first), record
            assert record["backend"] == "gloo", record
            assert record["trainer_module"].startswith(FRONTEND_PACKAGES[frontend].split(".")[0]), record
        assert records[0]["digest"] == records[1]["digest"], "ranks ended with different weights"
