"""``python -m lightning_anyaccel.validate``: validate this machine's device and write a record to send in.

The validation kit ships in the wheel: no checkout of the repository is needed. It runs the
device-generic checks on the device PyTorch reports (or ``--device TYPE``), each in a fresh process
and each wait bounded, shows its progress, and writes one validation record
(:mod:`lightning_anyaccel.kit.tools.records`, the format the support matrix reads) to ``--record PATH``
(default ``<type>-hardware.toml``): a vendor or a user with an Intel GPU, a Gaudi or an Ascend sends
that one file (docs/validate_hardware.md).

The checks (:data:`CHECKS`): a fit on one device, bf16-mixed and 16-mixed where the device autocasts
them, ``DeviceStatsMonitor``, a checkpoint saved on the device and resumed, an all-reduce over 2
processes, DDP, FSDP, FSDP2 and DeepSpeed ZeRO-2 fits (2 processes where there are 2 devices, else 1,
and the record says so), and a GPT-2 step where ``transformers`` is installed (with 2 devices or more also
DDP on every device against one device, :mod:`lightning_anyaccel.kit.tools.parity_gpt2`). A check that can not
run here is skipped with its reason, never counted as a pass. ``--checks fit,ddp`` runs some.

A device type the machine lacks is one line and exit status 2. Interrupted (Ctrl-C, ``SIGTERM``), the
kit ends every process it started and writes no record; the record is written at once at the end
(never a partial file). Exit status 0 when no check failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from lightning_anyaccel.kit.tools import records
from lightning_anyaccel.kit.tools.validation_checks import (
    BY_NAME,
    CHECKS,
    KitCheck,
    judge,
    judge_parity,
    parity_processes,
    process_count,
    skip_reason,
    worker,
)

if TYPE_CHECKING:
    from lightning_anyaccel.device.spec import DeviceSpec

#: The emulated accelerator of the repository's tests announces itself in this variable: a record of a
#: run on it is at level "emulated", never "hardware" (lightning_anyaccel.kit.emulator, docs/emulator.md).
EMULATOR_ENV = "LIGHTNING_ANYACCEL_EMULATE"
#: Bound of one check's processes, in seconds (DeepSpeed and GPT-2 import and build more).
CHECK_TIMEOUT = 300
SLOW_CHECK_TIMEOUT = 600


# ---- the launching process ---------------------------------------------------------------------------


class Interrupted(Exception):
    """``SIGTERM`` (or ``SIGINT``) arrived: end the run without a record."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _run_check(check: KitCheck, spec: DeviceSpec, count: int, env: dict[str, str],
               control: str = "none") -> records.Outcome:
    from lightning_anyaccel.kit.tools.local_runs import run_bounded

    device_type = spec.type  # what the worker's command line carries; its main resolves it once there
    processes = process_count(check, count)
    compared = parity_processes(check, count)  # the processes of its parity, where it has one here
    reason = skip_reason(check, spec, count)
    if reason:
        return records.Outcome("skipped", check.features, processes, reason)
    with tempfile.TemporaryDirectory(prefix=f"anyaccel-validate-{check.name}-") as tmp:
        cmd = [sys.executable, "-m", "lightning_anyaccel.validate", "--worker", check.name, "--device", device_type,
               "--devices", str(compared or processes or 1), "--out", tmp,
               *(["--parity-control", control] if control != "none" else [])]
        try:
            proc = run_bounded(cmd, timeout=SLOW_CHECK_TIMEOUT if check.slow else CHECK_TIMEOUT, env=env)
        except subprocess.TimeoutExpired as late:
            return records.Outcome("failed", check.features, processes, f"did not finish in {late.timeout:.0f} s")
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank*.json"))]
        if proc.returncode != 0:
            lines = [line for line in proc.stdout.splitlines() if line.strip()]
            error = next((line for line in reversed(lines) if "Error" in line or "error" in line), lines[-1] if lines else "")
            return records.Outcome("failed", check.features, processes, f"exit {proc.returncode}: {error.strip()[:300]}")
        try:
            detail = judge(check, spec, processes, ranks)
            if compared is None:
                if check.parity:  # a check with its own parity, on one device
                    detail += f"; parity with one device not checked: needs 2 {device_type} devices, found {count}"
                return records.Outcome("passed", check.features, processes, detail)
            measured = judge_parity(check, compared, Path(tmp))  # a ParityError names the step and tensor
            who = f"{compared} processes of {check.parity} match" if check.own_parity else "matches"
            detail += f"; {who} one device: {measured['line']}"
            return records.Outcome("passed", check.features, compared, detail, parity=measured["numbers"])
        except AssertionError as err:
            return records.Outcome("failed", check.features, processes, str(err)[:300])


def _level(spec: DeviceSpec) -> str:
    emulated = os.environ.get(EMULATOR_ENV, "").split(":")[0]
    return "emulated" if emulated == spec.type else "hardware"


def run(spec: DeviceSpec, checks: list[KitCheck], record_path: Path, command: str,
        echo: Callable[[str], None] = print, control: str = "none") -> dict[str, Any]:
    """Run ``checks`` on ``spec``'s device type, one after the other with progress lines; write and return the record.

    ``control`` breaks every parity run on purpose (the kit's tests: a broken strategy must fail its check).
    """
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.kit.tools.local_runs import child_env

    device_type = spec.type
    # CPU: processes, not devices, are the limit (one device, as torch counts it, runs 2 processes)
    count = 2 if spec.host else runtime.device_count(spec)
    env = child_env(threads=max(1, (os.cpu_count() or 2) // 2))
    outcomes: dict[str, records.Outcome] = {}
    echo(f"validating {device_type} ({count} device{'s' if count != 1 else ''}): {len(checks)} checks")
    for index, check in enumerate(checks, 1):
        started = time.monotonic()
        echo(f"[{index:>2}/{len(checks)}] {check.name} ...")
        outcome = _run_check(check, spec, count, env, control)
        outcomes[f"validate::{check.name}"] = outcome
        echo(f"[{index:>2}/{len(checks)}] {check.name}: {outcome.outcome.upper()} ({time.monotonic() - started:.0f} s)"
             f" {outcome.reason}")
    root = Path(__file__).resolve().parents[3]  # a checkout's root, where the package is installed editable
    level = _level(spec)
    record = records.build_record(device_type=device_type, level=level, tests=outcomes, command=command,
                                  covers=["src"], root=root if (root / "src" / "lightning_anyaccel").is_dir() else None,
                                  runner="lightning_anyaccel.validate",
                                  facts=records.device_facts(spec, emulated=level == "emulated"))
    records.write(record_path, record)
    return record


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m lightning_anyaccel.validate", description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="device type to validate (default: what PyTorch reports)")
    parser.add_argument("--record", default=None, type=Path,
                        help="where to write the record (default: ./<type>-<level>.toml, the name docs/records uses)")
    parser.add_argument("--checks", default=None,
                        help=f"comma-separated checks to run (default: all of {', '.join(BY_NAME)})")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--devices", default=1, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, type=Path, help=argparse.SUPPRESS)
    # a negative control of tools/parity.py (CONTROLS) in every parity run: the kit's tests show it fails
    parser.add_argument("--parity-control", default="none", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from lightning_anyaccel.kit.tools.parity import CONTROLS

    if args.parity_control not in CONTROLS:
        parser.error(f"--parity-control {args.parity_control!r}: one of {', '.join(CONTROLS)}")
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec

    device_type = args.device or runtime.detect_device_type()
    spec: DeviceSpec | None
    try:  # the one place the device type becomes its spec; everything below takes the spec
        spec = get_spec(device_type)
    except ValueError:
        spec = None
    if args.worker and spec is not None:  # a check's process: the launching one passed the type it resolved
        worker(BY_NAME[args.worker], spec, args.devices, args.out, args.parity_control)
        return 0
    if spec is None or not runtime.is_available(spec):
        print(f"validate: this machine has no {device_type!r} device (PyTorch here sees"
              f" {runtime.detect_device_type()!r}); install the vendor's PyTorch for it, or leave out --device",
              file=sys.stderr)
        return 2
    unknown = [n for n in (args.checks or "").split(",") if n and n not in BY_NAME]
    if unknown:
        parser.error(f"unknown check(s) {unknown}; the checks are {', '.join(BY_NAME)}")
    checks = [BY_NAME[n] for n in args.checks.split(",") if n] if args.checks else list(CHECKS)
    record_path = args.record or Path(f"{device_type}-{_level(spec)}.toml")
    command = shlex.join(["python", "-m", "lightning_anyaccel.validate", *(argv if argv is not None else sys.argv[1:])])
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        record = run(spec, checks, record_path, command, control=args.parity_control)
    except (KeyboardInterrupt, Interrupted) as why:
        print(f"validate: interrupted ({why or 'SIGINT'}): every process it started has ended; no record written",
              file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = f"{record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped"
    skipped = [name.removeprefix("validate::") for name, t in record["tests"].items() if t["outcome"] == "skipped"]
    print(f"\n{summary}" + (f" (skipped: {', '.join(skipped)})" if skipped else "")
          + f"\nrecord written to {record_path}: send it in (docs/validate_hardware.md)")
    return 0 if record["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
