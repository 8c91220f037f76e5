"""``python -m lightning_anyaccel.verify``: check that this environment can train, for any device.

Prints what PyTorch sees (device type, count, names, memory, collective backend), the device
spec the package derived for it (backend, autocast dtypes, seeding, memory statistics, fork
safety, vendor package), the versions, then runs four checks: a tiny single-device fit, a 2-process all-reduce on
the device's backend, a bf16 autocast check and a checkpoint round trip. A check that cannot run
here (a 2-process collective on a machine with one accelerator) is SKIP with the reason, never a
pass: the verdict is "VERIFICATION SUCCESSFUL" only when every check passed, "VERIFICATION PASSED
WITH N SKIPPED" naming the skipped ones otherwise. Exits 0 when no check failed; with
``--fail-on-skip`` (CI on a cluster, where every check must run) a skipped check fails too. Each failure is one line: the first line of
the error, which names the fix (never a traceback, never torch's dispatcher tables). The output
is plain text, meant to be pasted into a bug report; ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import io
import json
import logging
import multiprocessing as mp
import platform
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.device.spec import DeviceSpec
from lightning_anyaccel.kit.tools.local_runs import free_port

#: Every wait in the collective check is bounded by this many seconds.
COLLECTIVE_TIMEOUT_S = 120


@dataclass
class Check:
    """One verification step: ``PASS``, ``FAIL`` or ``SKIP`` with a one-line detail."""

    name: str
    status: str
    detail: str


@dataclass
class Report:
    """Everything ``verify`` found; ``ok`` is ``True`` when no check failed (skipped ones are :attr:`skipped`)."""

    environment: dict[str, Any]
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.status != "FAIL" for check in self.checks)

    @property
    def failed(self) -> list[str]:
        return [check.name for check in self.checks if check.status == "FAIL"]

    @property
    def skipped(self) -> list[str]:
        return [check.name for check in self.checks if check.status == "SKIP"]

    def verdict(self) -> str:
        """``VERIFICATION SUCCESSFUL`` (every check passed), ``... PASSED WITH N SKIPPED (skipped: ...)`` or
        ``... FAILED (failed: ...)``: a skipped check is never counted as a pass."""
        skipped = f"skipped: {', '.join(self.skipped)}" if self.skipped else ""
        if not self.ok:
            return f"VERIFICATION FAILED (failed: {', '.join(self.failed)}{'; ' + skipped if skipped else ''})"
        if self.skipped:
            return f"VERIFICATION PASSED WITH {len(self.skipped)} SKIPPED ({skipped})"
        return "VERIFICATION SUCCESSFUL"

    def to_text(self) -> str:
        width = max(len(key) for key in self.environment)
        lines = ["lightning-anyaccel environment report", "=" * 38]
        lines += [f"{key:<{width}} : {value}" for key, value in self.environment.items()]
        lines += ["", "checks", "-" * 6]
        lines += [f"[{check.status}] {check.name}: {check.detail}" for check in self.checks]
        lines += ["", self.verdict()]
        return "\n".join(lines)


def _first_line(err: BaseException) -> str:
    """``Type: first line`` of an error: torch's dispatcher errors add dozens of lines of kernel tables."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _vendor_version(module: str | None) -> str:
    """The installed version of the vendor package, whether it is imported, or ``n/a`` for torch's own devices."""
    if not module:
        return "n/a"
    top = module.split(".")[0]
    state = "imported" if top in sys.modules else (
        "installed, not imported" if importlib.util.find_spec(top) is not None else "not installed")
    version = getattr(sys.modules.get(top), "__version__", None)
    if version is None and state != "not installed":
        with contextlib.suppress(Exception):
            version = importlib.metadata.version(top)
    return f"{version} ({state})" if version else state


def describe_spec(spec: DeviceSpec) -> dict[str, Any]:
    """The device spec the package uses: where it comes from and what it says.

    >>> describe_spec(get_spec("cpu"))["device spec"]
    'device table, refined by PyTorch'
    """
    from lightning_anyaccel.device.devices import DEVICE_TABLE, derive_spec

    device_type = spec.type
    derived = derive_spec(device_type) is not None
    source = ("device table, refined by PyTorch" if device_type in DEVICE_TABLE and derived else
              "device table (PyTorch here does not know the type)" if device_type in DEVICE_TABLE else
              "derived from PyTorch (no table entry)")
    return {
        "device spec": source,
        "spec backend": spec.backend or "none (one device only)",
        "autocast dtypes": ", ".join(spec.autocast_dtypes) or "none (32-true only)",
        "seeding": ", ".join(spec.seed_functions) or "torch.manual_seed",
        "memory statistics": spec.memory_stats,
        "fork after init": "safe" if spec.fork_safe_after_init else "unsafe (use popen/spawn once initialised)",
        f"vendor package ({spec.vendor_module or '-'})": _vendor_version(spec.vendor_module),
    }


def describe(device_type: str) -> dict[str, Any]:
    """Facts about ``device_type`` and the software stack, for the report header.

    Never raises: a fact that can not be found says why in one line.
    """
    try:
        spec = get_spec(device_type)
    except ValueError:  # the "device" check says why and how to fix it
        return _describe(None, device_type)
    return _describe(spec, device_type)


def _describe(spec: DeviceSpec | None, asked: str) -> dict[str, Any]:
    """:func:`describe` with the spec resolved; ``None``: neither torch nor the table knows the type ``asked``."""
    import lightning

    import lightning_anyaccel
    from lightning_anyaccel.device.distributed import spec_backend

    facts: dict[str, Any] = {}
    if spec is None:
        facts["device type"] = f"{asked} (unknown to PyTorch here and to the device table)"
        facts["device spec"] = "none"
    else:
        facts["device type"] = f"{spec.type} ({spec.name})"
        facts.update(_device_facts(spec))
        try:
            backend = spec_backend(spec)
        except Exception as err:  # noqa: BLE001
            backend = f"unavailable ({_first_line(err)})"
        facts["collective backend"] = backend
        facts.update(describe_spec(spec))
    facts.update({
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "lightning-anyaccel": lightning_anyaccel.__version__,
        "platform": platform.platform(),
    })
    return facts


def _device_facts(spec: DeviceSpec) -> dict[str, Any]:
    """Count, names and memory of the devices (the host's for CPU)."""
    try:
        count = runtime.device_count(spec)
        names, memory = [], []
        if not spec.host and count:
            module = runtime.device_module(spec)
            for index in range(count):
                get_name = getattr(module, "get_device_name", None)
                names.append(get_name(index) if callable(get_name) else f"{spec.type}:{index}")
                props = getattr(module, "get_device_properties", None)
                total = getattr(props(index), "total_memory", None) if callable(props) else None
                memory.append(f"{total / 2**30:.1f} GiB" if total else "unknown")
        elif spec.host:
            import psutil

            names = [platform.processor() or platform.machine()]
            memory = [f"{psutil.virtual_memory().total / 2**30:.1f} GiB (host)"]
    except Exception as err:  # noqa: BLE001
        return {"device count": f"unknown ({_first_line(err)})"}
    return {"device count": count, "device names": ", ".join(names) or "none",
            "device memory": ", ".join(memory) or "unknown"}


def check_fit(spec: DeviceSpec, front_end: str = "lightning") -> str:
    """A 4-step fit on one device with ``front_end``'s Trainer (``"lightning"`` or ``"pytorch_lightning"``).

    Returns where the parameters ended up and the first and last loss.
    """
    from lightning_anyaccel import _lightning
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

    package = {f.package: f for f in _lightning.DISTRIBUTIONS}[front_end]
    Trainer = package.module("lightning.pytorch").Trainer
    model = _lightning.port(DemoModel, package)()
    logging.getLogger(package.trainer).setLevel(logging.WARNING)
    trainer = Trainer(
        accelerator=_lightning.port(AnyAccelerator, package)(spec),
        strategy="any_single",
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, demo_loader())
    device = trainer.strategy.root_device
    if device.type != spec.type:
        raise AssertionError(f"trained on {device}, expected {spec.type}")
    if not all(torch.isfinite(torch.tensor(model.losses))):
        raise AssertionError(f"non-finite loss: {model.losses}")
    return f"4 steps on {device}, loss {model.losses[0]:.3f} -> {model.losses[-1]:.3f}"


def _collective_worker(rank: int, spec: DeviceSpec, backend: str, port: int, queue: Any) -> None:
    import torch.distributed as dist

    try:
        device = spec.device(rank)
        runtime.set_device_index(spec, device.index)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        tensor = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(tensor)
        queue.put((rank, tensor.cpu().tolist(), None))
        dist.destroy_process_group()
    except Exception as err:  # reported to the parent, which fails the check
        queue.put((rank, None, f"{type(err).__name__}: {err}"))


def check_collective(spec: DeviceSpec) -> str:
    """All-reduce across 2 spawned processes on the device's backend, every wait bounded."""
    from lightning_anyaccel.device.distributed import spec_backend

    count = runtime.device_count(spec)
    if not spec.host and count < 2:
        raise _Skip(f"needs 2 {spec.type} devices, found {count}")
    backend = spec_backend(spec)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_collective_worker, args=(r, spec, backend, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = {}
    try:
        for _ in procs:
            rank, value, error = queue.get(timeout=COLLECTIVE_TIMEOUT_S)
            if error:
                raise AssertionError(f"rank {rank}: {error}")
            results[rank] = value
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    if any(value != [3.0] * 4 for value in results.values()):
        raise AssertionError(f"wrong all_reduce result: {results}")
    return f"all_reduce over 2 processes with {backend!r}: 1 + 2 = 3 on every rank"


def check_bf16(spec: DeviceSpec) -> str:
    """A matmul under ``torch.autocast(<type>, bfloat16)`` must produce bfloat16."""
    from lightning_anyaccel.device.precision import check_spec_precision

    check_spec_precision("bf16-mixed", spec)
    device = spec.device()
    a = torch.randn(8, 8, device=device)
    with torch.autocast(spec.type, dtype=torch.bfloat16):
        out = a @ a
    if out.dtype != torch.bfloat16:
        raise AssertionError(f"autocast produced {out.dtype}, expected torch.bfloat16")
    return f"matmul under autocast({spec.type!r}, bfloat16) -> {out.dtype}"


def check_checkpoint(spec: DeviceSpec) -> str:
    """Save a model's weights from the device and load them back with the portable map location."""
    from lightning_anyaccel.checkpoints.checkpoint import portable_map_location

    device = spec.device()
    model = torch.nn.Linear(4, 2).to(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "ckpt.pt")
        torch.save(model.state_dict(), path)
        loaded = torch.load(path, map_location=portable_map_location, weights_only=True)
    same = all(torch.equal(loaded[k].cpu(), v.cpu()) for k, v in model.state_dict().items())
    if not same:
        raise AssertionError("weights differ after the round trip")
    return f"state_dict saved from {device} and loaded back identical"


class _Skip(Exception):
    """A check that cannot run in this environment (not a failure)."""


CHECKS: list[tuple[str, Callable[[DeviceSpec], str]]] = [
    ("single-device fit", check_fit),
    ("2-process collective", check_collective),
    ("bf16 autocast", check_bf16),
    ("checkpoint round trip", check_checkpoint),
]


def run(device_type: str | None = None, front_end: str = "lightning") -> Report:
    """Describe the environment and run every check on ``device_type`` (default: detected).

    ``front_end`` is the Lightning package the fit runs with: ``"lightning"`` or ``"pytorch_lightning"``.
    """
    device_type = device_type or runtime.detect_device_type()
    try:
        spec = get_spec(device_type)
    except ValueError as err:  # a type neither torch nor the table knows: one failed check, with the fix
        report = Report(environment={**_describe(None, device_type), "front end": front_end})
        report.checks.append(Check("device", "FAIL", _first_line(err)))
        return report
    report = Report(environment={**_describe(spec, device_type), "front end": front_end})
    for name, check in CHECKS:
        try:
            result = check_fit(spec, front_end) if check is check_fit else check(spec)
            report.checks.append(Check(name, "PASS", result))
        except _Skip as skip:
            report.checks.append(Check(name, "SKIP", str(skip)))
        except Exception as err:  # noqa: BLE001 - every failure is one line of the report
            last = traceback.extract_tb(err.__traceback__)[-1]
            report.checks.append(Check(name, "FAIL", f"{_first_line(err)} (at {Path(last.filename).name}:{last.lineno})"))
    return report


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lightning_anyaccel.verify", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="device type to check (default: what PyTorch reports)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--fail-on-skip", action="store_true",
                        help="exit 1 when a check was skipped too (CI on a cluster, where every check must run)")
    parser.add_argument("--frontend", default=None, choices=["lightning", "pytorch_lightning"],
                        help="the Lightning package to train with (default: lightning, else pytorch_lightning)")
    args = parser.parse_args(argv)
    front_end = args.frontend or ("lightning" if importlib.util.find_spec("lightning") else "pytorch_lightning")
    try:
        report = run(args.device, front_end)
    except Exception as err:  # noqa: BLE001 - a bug of verify itself: still one readable line, no traceback
        print(f"VERIFICATION FAILED: {_first_line(err)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"environment": report.environment, "checks": [asdict(c) for c in report.checks],
                          "ok": report.ok, "skipped": report.skipped, "verdict": report.verdict()},
                         indent=2, default=str))
    else:
        print(report.to_text())
    if args.fail_on_skip and report.skipped:
        print(f"--fail-on-skip: {len(report.skipped)} check(s) skipped: {', '.join(report.skipped)}", file=sys.stderr)
        return 1
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
