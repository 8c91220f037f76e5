"""The checks of ``python -m lightning_anyaccel.validate``: what each trains, how it runs, how it is judged.

:data:`CHECKS` lists them; :func:`skip_reason` says, in the launching process, why one can not run
here; :func:`worker` runs one in its own process (every rank of a multi-process check) and writes
each rank's results; :func:`judge` turns those results into the check's outcome. The command that
starts the processes, bounds them and writes the record is :mod:`lightning_anyaccel.kit.validate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_anyaccel.device.spec import DeviceSpec


@dataclass(frozen=True)
class KitCheck:
    """One check: what it trains and with what, and the features of the record a pass proves.

    Attributes:
        name: the check's name (``--checks``, the record's test id ``validate::<name>``).
        features: the features (:data:`lightning_anyaccel.kit.tools.records.FEATURES`) a pass proves.
        strategy: the package's strategy the worker trains with.
        precision: the Trainer's precision.
        multi_process: trains with 2 processes where there are 2 devices (else 1, said in the record).
        slow: bounded by :data:`lightning_anyaccel.kit.validate.SLOW_CHECK_TIMEOUT` instead of
            :data:`~lightning_anyaccel.kit.validate.CHECK_TIMEOUT`.
        parity: judged by parity (:mod:`lightning_anyaccel.kit.tools.parity`): the run of this short name of
            :data:`lightning_anyaccel.kit.tools.parity_run.STRATEGIES` must reproduce the serial one-device
            run, per step and per tensor, within the fp32 tolerance; empty: judged by its loss.
        own_parity: judged by its loss and, where the device has 2 devices or more, also by the parity of its
            own model (the GPT-2 of :mod:`lightning_anyaccel.kit.tools.parity_gpt2`) trained with ``parity`` on
            every device against one device, in the check's precision.
    """

    name: str
    features: tuple[str, ...]
    strategy: str = "any_single"
    precision: str = "32-true"
    multi_process: bool = False
    slow: bool = False
    parity: str = ""
    own_parity: bool = False


CHECKS: tuple[KitCheck, ...] = (
    KitCheck("fit", ("single_device",)),
    KitCheck("bf16-mixed", ("mixed_precision",), precision="bf16-mixed"),
    KitCheck("16-mixed", ("mixed_precision",), precision="16-mixed"),
    KitCheck("device-stats", ("device_stats",)),
    KitCheck("checkpoint", ("checkpoint",)),
    KitCheck("collective", ()),
    KitCheck("ddp", ("ddp",), strategy="any_ddp", multi_process=True, parity="ddp"),
    KitCheck("fsdp", ("fsdp",), strategy="any_fsdp", multi_process=True, parity="fsdp"),
    KitCheck("fsdp2", ("fsdp2",), strategy="any_fsdp2", multi_process=True, parity="fsdp2"),
    KitCheck("deepspeed", ("deepspeed",), strategy="any_deepspeed_stage_2", multi_process=True, slow=True,
             parity="deepspeed_2"),
    KitCheck("transformer", ("transformer",), precision="bf16-mixed", slow=True, parity="ddp", own_parity=True),
)
BY_NAME = {check.name: check for check in CHECKS}


class Skip(Exception):
    """A check that can not run on this machine (the reason is the message)."""


# ---- what each check needs, asked in the launching process ----------------------------------------


def process_count(check: KitCheck, count: int) -> int | None:
    """How many processes ``check`` runs with on ``count`` devices (``None``: a single-process check)."""
    return min(2, count) if check.multi_process else None


def parity_processes(check: KitCheck, count: int) -> int | None:
    """How many processes the parity of ``check`` trains with on ``count`` devices (``None``: no parity).

    A check judged by parity compares its own processes (:func:`process_count`); a check with its own parity
    compares every device (N = ``count``) where there are 2 or more.
    """
    if not check.parity:
        return None
    if check.own_parity:
        return count if count >= 2 else None
    return process_count(check, count)


def skip_reason(check: KitCheck, spec: DeviceSpec, count: int) -> str | None:
    """Why ``check`` can not run on ``count`` devices of ``spec``'s type here, or ``None``."""
    import importlib.util

    device_type = spec.type
    if check.precision != "32-true" and not spec.supports_precision(check.precision):
        return f"{device_type} does not autocast {check.precision} (autocast dtypes: {spec.autocast_dtypes or 'none'})"
    if check.name == "collective" and count < 2:
        return f"needs 2 {device_type} devices, found {count}"
    if (check.multi_process or check.name == "collective") and not spec.backend:
        return f"{device_type} has no collective backend: one device only"
    if check.name == "deepspeed":
        from lightning_anyaccel.strategies.support import deepspeed_support

        support = deepspeed_support(spec)
        if not support.supported:
            return support.reason
    if check.name == "transformer" and importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install lightning-anyaccel[workloads])"
    return None


# ---- the worker: one check, in its own process (every rank of a multi-process check) -----------------


def _model(check: KitCheck) -> Any:
    """The LightningModule of a training check: the demo MLP, or a small GPT-2."""
    import torch
    from typing_extensions import override

    from lightning_anyaccel.kit.tools.demo import DemoModel

    if check.name == "transformer":
        return _gpt2_module()

    class KitModel(DemoModel):
        @override
        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=0.01)

    return KitModel(hidden=64)


def _gpt2_module() -> Any:
    """A 2-block GPT-2 from its config (nothing downloaded) that learns one fixed batch of byte tokens."""
    import torch
    from lightning.pytorch import LightningModule
    from transformers import GPT2Config, GPT2LMHeadModel
    from typing_extensions import override

    class GPT2Step(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2)
            self.model = GPT2LMHeadModel(config)
            self.losses: list[float] = []
            self.autocast_seen: list[tuple[str, str]] = []

        @override
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (tokens,) = batch
            if torch.is_autocast_enabled(tokens.device.type):
                dtype = str(torch.get_autocast_dtype(tokens.device.type)).replace("torch.", "")
                self.autocast_seen.append((tokens.device.type, dtype))
            loss = self.model(input_ids=tokens, labels=tokens).loss
            self.losses.append(float(loss.detach()))
            return loss

        @override
        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=3e-3)

    return GPT2Step()


def _loader(check: KitCheck) -> Any:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_anyaccel.kit.tools.demo import demo_loader

    if check.name == "transformer":  # one batch of text, seen every step: the loss must fall
        text = torch.tensor(list(b"Lightning trains on every accelerator PyTorch knows, with the same code. " * 2))[:64]
        return DataLoader(TensorDataset(text.repeat(8, 1)), batch_size=4)
    return demo_loader()


def worker(check: KitCheck, spec: DeviceSpec, devices: int, out: Path, control: str = "none") -> None:
    """Run ``check`` in this process (a rank of it) and write what it saw to ``out/rank<N>.json``.

    Each kind of check runs in its own module, and this process's Trainers share one accelerator: the
    all-reduce (:func:`lightning_anyaccel.kit.verify.check_collective`), a parity check's rank
    (:func:`lightning_anyaccel.kit.tools.parity_run.rank`), a training check, then the GPT-2's own parity
    (:func:`lightning_anyaccel.kit.tools.parity_gpt2.rank`). ``devices``: the processes of its parity where it has
    one. ``control`` breaks the parity's run on purpose (:data:`lightning_anyaccel.kit.tools.parity.CONTROLS`): the
    kit's own tests show that a broken strategy fails.
    """
    import torch
    from lightning.pytorch import Callback, Trainer
    from typing_extensions import override

    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.kit.tools import parity, parity_gpt2, parity_run
    from lightning_anyaccel.kit.tools.local_runs import quiet_lightning

    quiet_lightning(all_warnings=True)
    if check.name == "collective":
        from lightning_anyaccel.kit.verify import check_collective

        (out / "rank0.json").write_text(json.dumps({"rank": 0, "detail": check_collective(spec)}))
        return
    accelerator = AnyAccelerator(spec)
    if check.parity and not check.own_parity:
        trainer, model = parity_run.rank(accelerator, check.parity, devices, check.precision, control, out)
        result = {"rank": trainer.global_rank, "world_size": trainer.world_size, "global_step": trainer.global_step,
                  "losses": model.losses, "root_device": str(trainer.strategy.root_device),
                  "param_device": model.param_device, "batch_device": model.batch_device, "autocast": [],
                  "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                  "strategy": type(trainer.strategy).__name__, "sharded": check.parity == "fsdp2"}
        (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
        return
    if check.own_parity and not parity.launching():  # a rank DDP launched for the GPT-2's parity: only the parity
        parity_gpt2.rank(accelerator, devices, check.precision, control, out / "parity")
        return
    torch.manual_seed(0)
    seen: dict[str, Any] = {}

    class Probe(Callback):
        @override
        def on_train_batch_start(self, trainer: Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            seen["param_device"] = str(next(pl_module.parameters()).device)
            seen["batch_device"] = str(batch[0].device)

    class SaveAtTrainEnd(Callback):
        """Save the checkpoint at the end of training, before Lightning's teardown moves the model to the CPU."""

        @override
        def on_train_end(self, trainer: Trainer, pl_module: Any) -> None:
            if not (out / "last.ckpt").exists():
                trainer.save_checkpoint(out / "last.ckpt")

    callbacks: list[Callback] = [Probe()] + ([SaveAtTrainEnd()] if check.name == "checkpoint" else [])
    logger: Any = False
    if check.name == "device-stats":
        from lightning.pytorch.callbacks import DeviceStatsMonitor
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(out, name="stats")
        callbacks.append(DeviceStatsMonitor())
    steps = 4 if check.name == "checkpoint" else 6

    def fit(max_steps: int, ckpt_path: str | None = None) -> tuple[Trainer, Any]:
        model = _model(check)
        trainer = Trainer(accelerator=accelerator, strategy=check.strategy, devices=1,
                          precision=check.precision,  # type: ignore[arg-type]  # a str of Lightning's literals
                          max_steps=max_steps, logger=logger, callbacks=callbacks,
                          log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
        trainer.fit(model, _loader(check), ckpt_path=ckpt_path)
        return trainer, model

    trainer, model = fit(steps)
    result = {
        "rank": trainer.global_rank, "world_size": trainer.world_size, "global_step": trainer.global_step,
        "losses": model.losses, "autocast": sorted({f"{t}:{d}" for t, d in model.autocast_seen}),
        "root_device": str(trainer.strategy.root_device), **seen,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "strategy": type(trainer.strategy).__name__,
    }
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    result["precision_device"] = getattr(trainer.precision_plugin, "device", None)  # autocast's and the scaler's
    result["scaler"] = bool(scaler is not None and scaler.is_enabled())
    if check.name == "device-stats":
        log_dir = trainer.logger.log_dir if trainer.logger else None
        result["metrics"] = (Path(log_dir) / "metrics.csv").read_text() if log_dir else ""
    if check.name == "checkpoint":
        from lightning_anyaccel.checkpoints.checkpoint import portable_map_location

        path = out / "last.ckpt"  # saved by SaveAtTrainEnd while the weights were on the device
        stored = torch.load(path, map_location=portable_map_location, weights_only=False)
        result["stored_devices"] = sorted({t.device.type for t in stored["state_dict"].values()})
        resumed, again = fit(8, ckpt_path=str(path))
        result["resumed_step"], result["resumed_losses"] = resumed.global_step, again.losses
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if check.own_parity and devices >= 2:  # the serial runs first, then DDP on every device
        parity_gpt2.rank(accelerator, devices, check.precision, control, out / "parity")


def judge_parity(check: KitCheck, processes: int | None, out: Path) -> dict[str, Any]:
    """A parity check's measured differences: ``line`` (words) and ``numbers`` (the record's ``parity``).

    Raises ``ParityError`` (an ``AssertionError``) naming the step and tensor that differ.
    """
    from lightning_anyaccel.kit.tools import parity_run

    where = out / "parity" if check.own_parity else out
    report = parity_run.judge(where, check.parity, processes or 1, check.precision)
    numbers = {key: value for key, value in report.as_dict().items() if key != "strategy"}
    return {"line": report.line().partition(": ")[2], "numbers": numbers}


# ---- judging a check's results, in the launching process ----------------------------------------------


def judge(check: KitCheck, spec: DeviceSpec, processes: int | None, ranks: list[dict[str, Any]]) -> str:
    """The one-line detail of a check that passed; ``AssertionError`` naming what is wrong otherwise."""
    device_type = spec.type
    expected = processes or 1
    if len(ranks) != expected:
        raise AssertionError(f"{len(ranks)} of {expected} processes reported")
    if check.name == "collective":
        return str(ranks[0]["detail"])
    steps = 4 if check.name == "checkpoint" else 3 if check.parity and not check.own_parity else 6
    for rank in ranks:
        if rank["global_step"] != steps:
            raise AssertionError(f"rank {rank['rank']} stopped at step {rank['global_step']}")
        for key in ("root_device", "param_device", "batch_device"):
            if str(rank.get(key, "")).split(":")[0] != device_type:
                raise AssertionError(f"rank {rank['rank']}: {key} is {rank.get(key)}, not on {device_type}")
        losses = rank["losses"]
        if not losses or not all(loss == loss and abs(loss) < 1e6 for loss in losses):
            raise AssertionError(f"rank {rank['rank']}: non-finite losses {losses}")
    first = ranks[0]
    if check.name in ("fit", "transformer") and not first["losses"][-1] < first["losses"][0]:
        raise AssertionError(f"the loss did not fall: {first['losses'][0]:.4f} -> {first['losses'][-1]:.4f}")
    if check.precision != "32-true":
        dtype = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}[check.precision]
        if first["autocast"] != [f"{device_type}:{dtype}"]:
            raise AssertionError(f"autocast in training_step was {first['autocast']}, not {device_type}:{dtype}")
    if check.precision != "32-true" and first["precision_device"] != device_type:
        raise AssertionError(f"the precision plugin is for {first['precision_device']}, not {device_type}")
    if check.precision == "16-mixed" and not first["scaler"]:
        raise AssertionError("16-mixed trained without a GradScaler")
    if check.multi_process:
        backends = {rank["backend"] for rank in ranks}
        if None in backends or len(backends) != 1:
            raise AssertionError(f"process group backends {backends}")
    if check.strategy == "any_fsdp2" and not all(rank.get("sharded") for rank in ranks):
        raise AssertionError("configure_model got no device mesh: FSDP2 did not shard")
    if check.name == "device-stats":
        header = first["metrics"].splitlines()[0] if first["metrics"] else ""
        wanted = "cpu_percent" if spec.host else "allocated_bytes.all.current"
        if wanted not in header:
            raise AssertionError(f"DeviceStatsMonitor logged no {wanted}: {header[:300]}")
    if check.name == "checkpoint":
        if first["stored_devices"] != [device_type]:  # portable_map_location keeps them on a device that exists
            raise AssertionError(f"the checkpoint's tensors loaded on {first['stored_devices']}, not {device_type}")
        if first["resumed_step"] != 8 or len(first["resumed_losses"]) != 4:
            raise AssertionError(f"resumed to step {first['resumed_step']} with {len(first['resumed_losses'])} new steps")
    where = f"{expected} process{'es' if expected != 1 else ''} on {first['root_device'].split(':')[0]}"
    backend = f", backend {first['backend']}" if first.get("backend") else ""
    return f"{where}{backend}, loss {first['losses'][0]:.3f} -> {first['losses'][-1]:.3f}"


__all__ = ["BY_NAME", "CHECKS", "KitCheck", "Skip", "judge", "judge_parity", "parity_processes", "process_count",
           "skip_reason", "worker"]
