"""Real Lightning training through the package's generic path (no simulation), on the device under test.

CPU by default; ``pytest --device emulated:npu`` (or a real device type) runs the tests marked
``device_generic`` on that device. A behaviour Fabric has too is one test parameterised by front
end (``front_ends.py``): in-process through :func:`_fit_through`, in real processes through the two
scripts of :data:`SCRIPTS` (``tests/scripts/train.py`` and ``fabric_train.py``: the same arguments and
record, ``tests/scripts/script_common.py``). What only Fabric has is in ``test_fabric.py``."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lightning import Trainer
from lightning.pytorch.callbacks import Callback, DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger

import lightning_anyaccel  # noqa: F401  (registers names)
from conftest import DDP_TIMEOUT, SRC, rank_device, run_python
from front_ends import EVERY_FRONT_END, FRONT_ENDS, FrontEndCase
from lightning_anyaccel import AnyAccelerator, AnySingleDeviceStrategy
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.device.distributed import ForkAfterInitError
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

TRAIN = str(Path(__file__).parent / "scripts" / "train.py")


class _DeviceProbe(Callback):
    """Records where the parameters and the batch were during each training step."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen.add((next(pl_module.parameters()).device.type, batch[0].device.type))


def _fit(model=None, **kwargs):
    torch.manual_seed(0)  # the same start on every worker, whatever ran before (the losses must fall)
    model = model or DemoModel()
    probe = _DeviceProbe()
    defaults = dict(max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
    kwargs["callbacks"] = [*kwargs.get("callbacks", []), probe]
    trainer = Trainer(**{**defaults, **kwargs})
    trainer.fit(model, demo_loader())
    model.devices_seen = probe.seen
    return trainer, model


@pytest.mark.device_generic
@pytest.mark.feature("single_device")
@pytest.mark.parametrize(
    "flags",
    [
        lambda device_type: dict(accelerator=AnyAccelerator(), devices=1),
        lambda device_type: dict(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1),
        lambda device_type: dict(accelerator="any", strategy="any_single", devices=1),
        # "auto" is every device: one on CPU, so give 1 where there are several
        lambda device_type: dict(accelerator="any", strategy=AnySingleDeviceStrategy(),
                                 devices="auto" if device_type == "cpu" else 1),
    ],
    ids=["instance-auto-strategy", "typed-any_single", "any-name", "strategy-instance"],
)
def test_single_device_fit_learns(flags, device_type):
    trainer, model = _fit(**flags(device_type))
    assert trainer.global_step == 6
    assert trainer.strategy.root_device.type == device_type
    assert model.devices_seen == {(device_type, device_type)}  # parameters and batches lived on the device
    assert model.losses[-1] < model.losses[0]


@pytest.mark.device_generic
@pytest.mark.feature("mixed_precision")
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_bf16_mixed_autocast_active_in_training_step(front_end: FrontEndCase, device_type):
    built, model = _fit_through(front_end, accelerator=AnyAccelerator(), strategy="any_single", devices=1,
                                precision="bf16-mixed")
    assert front_end.precision(built).device == device_type
    assert front_end.strategy_precision(built) is front_end.precision(built)  # aligned before the front end took it
    assert model.autocast_seen == [(device_type, "bfloat16")] * 6
    assert float(front_end.all_reduce(built, torch.tensor(1.0, device=built.strategy.root_device), "sum")) == 1.0
    assert built.strategy.broadcast({"token": "from-rank-0"}) == {"token": "from-rank-0"}


def _fit_through(front_end: FrontEndCase, **flags):
    """:func:`_fit` for the Trainer; for Fabric, the same model and data in the loop ``Trainer.fit`` runs."""
    if front_end.side == "trainer":
        return _fit(**flags)
    torch.manual_seed(0)
    fabric, model = front_end.build(**flags), DemoModel()
    _fit_with_fabric(fabric, model)
    return fabric, model


def _fit_with_fabric(fabric, model, steps: int = 6) -> None:
    """``steps`` optimizer steps of ``model`` on the demo data, written with Fabric."""
    fabric.launch()
    module, optimizer = fabric.setup(model, model.configure_optimizers())
    for batch_idx, batch in zip(range(steps), fabric.setup_dataloaders(demo_loader())):
        with fabric.autocast():  # what the Trainer enters around training_step
            loss = module.training_step(batch, batch_idx)
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.device_generic
@pytest.mark.feature("mixed_precision")
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_16_mixed_uses_device_scaler(front_end: FrontEndCase, device_type):
    """Lightning builds 16-mixed for 'cuda' on an accelerator instance; ours autocasts and scales on the device."""
    flags = dict(accelerator=AnyAccelerator(device_type), strategy="any_single", devices=1, precision="16-mixed")
    built, model = _fit_through(front_end, **flags)
    plugin = front_end.precision(built)
    assert model.autocast_seen and set(model.autocast_seen) == {(device_type, "float16")}
    assert plugin.device == device_type
    assert plugin.scaler is not None
    assert plugin.scaler._device == device_type
    assert plugin.scaler._scale.device.type == device_type  # the scaler ran on the device
    with plugin.forward_context():  # what Fabric's autocast() and Trainer's steps enter
        assert torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.float16
        out = torch.nn.Linear(4, 2).to(built.strategy.root_device)(torch.ones(3, 4, device=built.strategy.root_device))
    assert out.dtype == torch.float16  # autocast really dispatched for the device type


@pytest.mark.device_generic
def test_device_report_names_the_device_used(device_type, caplog, lightning_info_logs):
    """Lightning's report says "GPU available but not used" while the package trains on that GPU, and
    says nothing of other devices; with the package's accelerator the report names the device in use."""
    import warnings

    from lightning_anyaccel.device import runtime

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(accelerator="any", devices=1, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    assert not [w for w in caught if "available but" in str(w.message)], [str(w.message) for w in caught]
    found = runtime.detect_device_type()
    if found == "cpu":
        assert "No accelerator found: training on CPU" in caplog.text
        return
    assert f"{get_spec(found).name} available: True ({found}), used: True (AnyAccelerator, 1 device(s))" in caplog.text
    assert "GPU available: True (cuda), used: False" not in caplog.text
    with pytest.warns(UserWarning, match=f"available but this Trainer trains on cpu: .* picks the {found}"):
        Trainer(accelerator=AnyAccelerator("cpu"), devices=1, logger=False)


def test_32_true_has_no_autocast():
    _, model = _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1)
    assert model.autocast_seen == []


@pytest.mark.device_generic
@pytest.mark.feature("device_stats")
def test_device_stats_monitor_gets_stats(tmp_path, device_type):
    logger = CSVLogger(tmp_path, name="stats")
    _fit(accelerator=AnyAccelerator(), strategy="any_single", devices=1, logger=logger,
         callbacks=[DeviceStatsMonitor()], log_every_n_steps=1)
    metrics = (Path(logger.log_dir) / "metrics.csv").read_text()
    if device_type == "cpu":
        assert "cpu_percent" in metrics and "cpu_vm_percent" in metrics
        return
    # a device's allocator counts what the model and batches occupy: real, non-zero numbers
    rows = list(csv.DictReader(metrics.splitlines()))
    allocated = [float(r[k]) for r in rows for k in r if k.endswith("allocated_bytes.all.current") and r[k]]
    assert allocated and min(allocated) > 0, metrics[:2000]


def _ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


#: The script of each front end: the same run, arguments and record (tests/scripts/script_common.py).
SCRIPTS = {"trainer": TRAIN, "fabric": str(Path(__file__).parent / "scripts" / "fabric_train.py")}
#: The launcher each start method gets: Lightning's for popen (it re-runs the script), the package's otherwise.
LAUNCHERS = {"any_ddp": "_SubprocessScriptLauncher", "any_ddp_spawn": "AnyMultiProcessingLauncher",
             "any_ddp_fork": "AnyMultiProcessingLauncher"}
def _run_script(python_runner, front_end: FrontEndCase, out: Path, *args: str) -> list[dict]:
    proc = python_runner([SCRIPTS[front_end.side], "--out", str(out), *args], timeout=DDP_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return _ranks(out)


@pytest.fixture(scope="module")
def popen_ddp_job(tmp_path_factory, device) -> Callable[[FrontEndCase], tuple[list[dict], Path]]:
    """``popen_ddp_job(front_end)``: each rank's record and the checkpoint of that front end's one 2-process
    ``any_ddp`` job on the device under test (4 steps in bf16-mixed, saved at the end), run on first use:
    test_ddp_two_processes checks its ranks, test_checkpoint_from_two_processes_resumes_on_one resumes its
    checkpoint, from one start of the two processes."""
    done: dict[str, tuple[list[dict], Path]] = {}

    def run(front_end: FrontEndCase) -> tuple[list[dict], Path]:
        if front_end.side not in done:
            root = tmp_path_factory.mktemp(f"popen-ddp-{front_end.side}")
            ckpt = root / "last.ckpt"
            ranks = _run_script(run_python, front_end, root, "--strategy", "any_ddp", "--devices", "2", "--steps",
                                "4", "--precision", "bf16-mixed", "--device-type", device.type, "--save", str(ckpt))
            done[front_end.side] = ranks, ckpt
        return done[front_end.side]

    return run


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.feature("ddp", processes=2)
@pytest.mark.parametrize("strategy", ["any_ddp", "any_ddp_spawn", "any_ddp_fork"])
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_ddp_two_processes(python_runner, popen_ddp_job, tmp_path, front_end: FrontEndCase, strategy, device):
    """Two real processes per start method: our strategy and launcher, the device's backend, the precision
    on the device (bf16-mixed; 32-true with fork: no autocast at all), collectives right, ranks in sync."""
    # spawn on a device: lightning-habana's form, AnyDDPStrategy(parallel_devices=[torch.device(TYPE)] * 2)
    unnumbered = ["--unnumbered"] if strategy == "any_ddp_spawn" and front_end.side == "trainer" else []
    precision = "32-true" if strategy == "any_ddp_fork" else "bf16-mixed"
    if strategy == "any_ddp":  # popen: the job whose checkpoint the next test resumes
        ranks = popen_ddp_job(front_end)[0]
    else:
        ranks = _run_script(python_runner, front_end, tmp_path, "--strategy", strategy, "--devices", "2", "--steps",
                            "4", "--precision", precision, "--device-type", device.type, *unnumbered)
    assert [r["rank"] for r in ranks] == [0, 1]
    for record in ranks:
        assert record["world_size"] == 2
        assert record["strategy"] == "AnyDDPStrategy"
        assert record["strategy_module"] == front_end.package.AnyDDPStrategy.__module__
        assert record["launcher"] == LAUNCHERS[strategy]
        assert record["backend"] == device.backend
        assert record["device"] == record["param_device"] == rank_device(device, record["rank"])
        assert record["precision_device"] == (device.type if precision == "bf16-mixed" else None)
        assert record["autocast"] == ([[device.type, "bfloat16"]] if precision == "bf16-mixed" else [])
        assert record["step"] == 4
        assert record["all_reduce_sum"] == 3.0 and record["all_reduce_mean"] == 1.5  # 1 + 2
        assert record["all_gather"] == [0, 1]
        assert record["broadcast"] == {"token": "from-rank-0"}
    assert ranks[0]["pid"] != ranks[1]["pid"]
    # gradients were all-reduced: identical weights on both ranks, different data per rank
    assert ranks[0]["weights"] == ranks[1]["weights"], "DDP did not keep the replicas in sync"
    assert ranks[0]["losses"] != ranks[1]["losses"], "both ranks saw the same data (no distributed sampler)"
    if front_end.side != "fabric":
        return
    # Fabric's record also has its precision plugin and the autocast state of every step and of forward
    mixed = precision == "bf16-mixed"
    dtype = "torch.bfloat16" if mixed else str(torch.get_autocast_dtype(device.type))  # off: the device's default
    for record in ranks:
        assert record["autocast_in_step"] == [[mixed, dtype]] * 4
        assert record["autocast_in_forward"] == [[device.type, mixed, dtype]]
        assert record["precision"] == ("MixedPrecision" if mixed else "Precision")
    if strategy != "any_ddp":  # Fabric's launch() returns rank 0's result to the launching process
        parent = json.loads((tmp_path / "parent.json").read_text())
        assert parent["pid"] not in {r["pid"] for r in ranks}
        assert parent["result"]["rank"] == 0 and parent["result"]["weights"] == ranks[0]["weights"]


@pytest.mark.slow
def test_lightnings_ddp_spawn_with_any_accelerator_keeps_ranks_in_sync(python_runner, tmp_path):
    """torch puts spawned CPU weights in shared memory; Lightning unshares them only for its own
    CPUAccelerator. Without the package's fix both ranks step the same weights and drift apart.
    (Lightning's *class*: the name ``"ddp_spawn"`` selects the package's strategy, see test_user_forms.py.)"""
    proc = python_runner([TRAIN, "--strategy", "lightning:ddp_spawn", "--devices", "2", "--out", str(tmp_path)],
                         timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = _ranks(tmp_path)
    assert [r["strategy"] for r in ranks] == ["DDPStrategy", "DDPStrategy"]
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.feature("checkpoint", processes=2)
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_checkpoint_from_two_processes_resumes_on_one(python_runner, popen_ddp_job, tmp_path, monkeypatch,
                                                      front_end: FrontEndCase, device):
    """Saved by 2 processes (the ``any_ddp`` job of test_ddp_two_processes), loaded by 1 (in this process, in
    32-true): the weights restored, the step count continued."""
    out2 = tmp_path / "run2"
    out2.mkdir()
    saved, ckpt = popen_ddp_job(front_end)
    assert ckpt.exists() and [r["step"] for r in saved] == [4, 4]
    if not device.is_cpu:
        check_loads_without_the_device(python_runner, ckpt, device.type)
    monkeypatch.setattr(sys, "path", [str(Path(SCRIPTS[front_end.side]).parent), *sys.path])
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    script = __import__(Path(SCRIPTS[front_end.side]).stem)
    script.main(["--strategy", "any_single", "--devices", "1", "--steps", "8", "--device-type", device.type,
                 "--out", str(out2), "--load", str(ckpt)])
    (record,) = _ranks(out2)
    assert record["world_size"] == 1 and record["backend"] is None
    assert record["start_weights"] == saved[0]["weights"]  # restored
    assert record["step"] == 8
    assert len(record["losses"]) == 4  # continued from step 4, did not restart
    assert record["weights"] != saved[0]["weights"]  # it trained on after loading


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.feature("fork_safety")
def test_fork_refused_after_the_parent_initialised_the_device(python_runner, tmp_path, device):
    """The children of a fork after initialisation could not use the device: the package refuses first."""
    if get_spec(device.type).fork_safe_after_init:
        pytest.skip(f"{device.type} may fork after initialisation")
    proc = python_runner([TRAIN, "--strategy", "any_ddp_fork", "--devices", "2", "--device-type", device.type,
                          "--touch-device", "--out", str(tmp_path)], timeout=120)
    assert proc.returncode != 0
    assert "ForkAfterInitError" in proc.stdout and "was already initialised in this process" in proc.stdout
    assert not list(tmp_path.glob("rank*.json"))


def check_loads_without_the_device(python_runner, path: Path, device_type: str) -> None:
    """A checkpoint of device tensors (the Trainer's or Fabric's, saved at step 4) loads in a plain-CPU process
    that never loaded the device's backend."""
    code = (
        "import os, sys, torch\n"
        f"path = {str(path)!r}\n"
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone', 'the device backend is loaded'\n"
        # check_available: a CUDA build of torch without a GPU still reports "cuda" without it
        "current = torch.accelerator.current_accelerator(check_available=True)\n"
        f"assert current is None or current.type != {device_type!r}, current\n"
        "from lightning_anyaccel import portable_map_location\n"
        "try:\n"
        "    torch.load(path, weights_only=False)\n"
        "    sys.exit('loading device tensors without map_location unexpectedly worked')\n"
        "except (RuntimeError, AttributeError) as err:\n"
        f"    assert {device_type!r} in str(err).lower() or 'privateuse' in str(err).lower(), err\n"
        "ckpt = torch.load(path, map_location=portable_map_location, weights_only=False)\n"
        "def tensors(x):\n"  # every tensor of the checkpoint: the Trainer's state_dict, Fabric's model and optimizer
        "    if isinstance(x, torch.Tensor): return [x]\n"
        "    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else []\n"
        "    return [t for item in items for t in tensors(item)]\n"
        "found = tensors(ckpt)\n"
        "assert found and all(t.device.type == 'cpu' for t in found)\n"
        "print('LOADED', ckpt['global_step'] if 'global_step' in ckpt else ckpt['step'])\n"
    )
    clean = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    clean["PYTHONPATH"] = str(SRC)
    proc = subprocess.run([sys.executable, "-c", code], env=clean, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0 and "LOADED 4" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    # the file really holds device tensors: its storages are tagged with the device type
    with zipfile.ZipFile(path) as archive:
        pickled = next(archive.read(n) for n in archive.namelist() if n.endswith("data.pkl"))
    assert f"{device_type}:".encode() in pickled


def test_names_register():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    for name in ("any_single", "any_ddp", "any_ddp_spawn", "any_ddp_fork", "any_ddp_notebook"):
        assert name in StrategyRegistry
    for name in ("any", "xpu", "hpu", "npu", "sdaa", "mlu", "musa"):
        assert name in AcceleratorRegistry
    assert AcceleratorRegistry["cpu"]["accelerator"].__module__.startswith("lightning.")  # Lightning keeps its own


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("front_end", EVERY_FRONT_END)
def test_ddp_strategy_instance_and_registry_names(front_end: FrontEndCase, device):
    ddp = front_end.package.AnyDDPStrategy
    built = front_end.build(accelerator="any", strategy="any_ddp_spawn", devices=2)
    assert type(built.strategy) is ddp and built.strategy._start_method == "spawn"
    built = front_end.build(accelerator=front_end.package.AnyAccelerator(), strategy=ddp(start_method="spawn"), devices=2)
    assert built.strategy.launcher.__class__.__name__ == "AnyMultiProcessingLauncher"
    assert built.world_size == 2
    if runtime.is_initialized(spec := get_spec(device.type)) and not spec.fork_safe_after_init:
        # an earlier test used the device in this process: forking is refused, naming what works
        with pytest.raises(ForkAfterInitError, match="any_ddp_spawn"):
            front_end.build(accelerator=front_end.package.AnyAccelerator(), strategy=ddp(start_method="fork"), devices=2)
        return
    built = front_end.build(accelerator=front_end.package.AnyAccelerator(), strategy=ddp(start_method="fork"), devices=2)
    assert built.strategy.num_processes == 2 and built.strategy._get_process_group_backend() == device.backend
