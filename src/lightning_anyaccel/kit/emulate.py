"""Run a program, unchanged, on an emulated accelerator, and report what keeps it from running on any device.

::

    python -m lightning_anyaccel.emulate --as xpu --devices 2 -- python train.py --fast_dev_run
    python -m lightning_anyaccel.emulate --as npu --memory 4GiB -- torchrun --nproc-per-node 2 train.py
    python -m lightning_anyaccel.emulate --scan-only train.py src/

First the static scan (:mod:`lightning_anyaccel.kit.emulator.scan`) lists the CUDA-only code of the
program's files. Then the command runs with the emulated device loaded in every Python process it
starts (DDP ranks, ``torchrun``/``mpirun`` ranks: ``LIGHTNING_ANYACCEL_EMULATE`` and the autoload
folder on ``PYTHONPATH`` are inherited), each process writing what it found
(:mod:`lightning_anyaccel.kit.emulator.problems`) into a temporary folder this command reads at the end.
Exit status: the program's when it failed, 1 when the scan or the run found a problem or no process of the
program had the device, 2 for an option the device can not have (checked before anything runs), else 0.
See docs/emulate.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Launchers and interpreters whose own arguments come before the program's script.
_RUNNERS = ("python", "torchrun", "mpirun", "mpiexec", "srun", "lightning", "accelerate")


def script_of(command: list[str]) -> Path | None:
    """The first ``.py`` file the command names (``python train.py``, ``torchrun ... train.py``)."""
    for arg in command:
        if arg.endswith(".py") and Path(arg).is_file():
            return Path(arg)
    return None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_anyaccel.emulate",
        description="Run a program on an emulated accelerator (any device name) and report each device-portability"
                    " problem with its file and line. Put the program's command after `--`.")
    parser.add_argument("--as", dest="name", default="npu", metavar="NAME",
                        help="the device type to emulate: npu (default), xpu, hpu, or any name")
    parser.add_argument("--devices", type=int, default=2, help="how many devices (default 2)")
    parser.add_argument("--memory", default=None, metavar="SIZE",
                        help="each device's capacity, e.g. 4GiB or 512MiB (default 16GiB): past it, out of memory")
    parser.add_argument("--scan-only", action="store_true", help="only scan the source files; run nothing")
    parser.add_argument("--no-scan", action="store_true", help="run without scanning the source first")
    parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                        help="end the program (every process it started) after this long (default 3600)")
    parser.add_argument("paths", nargs="*", type=Path,
                        help="files or folders to scan (default: the command's script and its folder)")
    return parser


def _spec(args: argparse.Namespace) -> str:
    """The device spec of the options; a bad option ends the command (exit 2) naming it, before anything runs."""
    from lightning_anyaccel.kit.emulator import check_spec

    checks = [("--as", args.name, args.name), ("--devices", str(args.devices), f"{args.name}:{args.devices}")]
    if args.memory:
        checks.append(("--memory", args.memory, f"{args.name}:1:memory={args.memory}"))
    for option, value, spec in checks:
        try:
            check_spec(spec)
        except ValueError as err:
            _parser().error(f"{option} {value}: {err}")
    return f"{args.name}:{args.devices}" + (f":memory={args.memory}" if args.memory else "")


def run_scan(paths: list[Path]) -> int:
    """Print the scan's findings; return how many."""
    from lightning_anyaccel.kit.emulator.scan import scan

    findings = scan(paths)
    shown = ", ".join(str(p) for p in paths)
    if not findings:
        print(f"scan: no CUDA-only code in {shown}")
        return 0
    print(f"scan: {len(findings)} CUDA-only construct(s) in {shown} (nothing was changed):")
    for finding in findings:
        print(f"  {finding}")
    return len(findings)


def _run(command: list[str], env: dict[str, str], timeout: float) -> int:
    """The program in its own process group; at the timeout or an interrupt every process of it ends."""
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"emulate: the program ran past --timeout {timeout:g} s; ending it", file=sys.stderr)
        return _end(proc, 124)
    except KeyboardInterrupt:
        return _end(proc, 130)


def _end(proc: subprocess.Popen[bytes], status: int) -> int:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    return status


#: What to do about each kind of problem, printed under it.
HINTS = {
    "tensor on another device": "a tensor made without device= lives on the CPU: create it on the data's device"
                                " (device=x.device, or self.device in a LightningModule) or register it as a buffer",
    "CUDA-only code": "Lightning places the model and batches; elsewhere use .to(device) with the device in use",
    "out of memory": "the size fits your host, not a device of this capacity: use a smaller batch, or --memory to"
                     " match the target device",
}


def summarize(reports: list[dict[str, Any]], name: str, returncode: int) -> tuple[str, int]:
    """The report's text and how many problems it lists."""
    problems: dict[tuple[str, str, int], dict[str, Any]] = {}
    for report in reports:
        for problem in report["problems"]:
            frame: dict[str, Any] = problem["frames"][0] if problem["frames"] else {"file": "?", "line": 0}
            key = (str(problem["kind"]), str(frame["file"]), int(frame["line"]))
            entry = problems.setdefault(key, {**problem, "ranks": set()})
            entry["ranks"].add(report["rank"] if report["rank"] is not None else report["pid"])
    steps = max((r["steps"] for r in reports), default=0)
    ranks = sorted(r["rank"] for r in reports if r["rank"] is not None)
    lines = ["", "== emulated device report ==",
             f"device: {name} (emulated)   processes: {len(reports)}"
             + (f" (ranks {', '.join(map(str, ranks))})" if ranks else "")
             + f"   optimizer steps: {steps} (the most any process took)   exit status: {returncode}"]
    if not reports:
        lines.append("problems: not known: no process of the program had the emulated device")
    elif not problems:
        lines.append("problems: none" + (" found before the program failed" if returncode else ""))
    for (kind, file, line), problem in problems.items():
        lines.append(f"{file}:{line}: {kind}: {problem['message']}")
        for frame in problem["frames"]:
            lines.append(f"    {frame['file']}:{frame['line']} in {frame['function']}: {frame['code']}")
        if problem.get("origin"):
            lines.append(f"    {problem['origin']}")
        fix = _fix(problem)
        if fix:
            lines.append(f"    fix: {fix}")
    return "\n".join(lines), len(problems)


def _fix(problem: dict[str, Any]) -> str:
    """What to write instead: the scan's code for a ``torch.cuda`` call, else the kind's hint."""
    if problem["kind"] == "CUDA-only API" and problem.get("api"):
        from lightning_anyaccel.kit.emulator.scan import replacement_for, scan

        api = f"torch.cuda.{problem['api']}"
        frame = problem["frames"][0] if problem["frames"] else {"file": "", "line": 0}
        found = [f for f in (scan([Path(str(frame["file"]))]) if frame["file"] else [])
                 if f.line == frame["line"] and f.what.replace("amp.", "") == api]
        if not found:
            return f"{replacement_for(str(problem['api']))} (...: the call's own arguments)"
        return f"{found[0].replacement} (runs on every device, and on a machine without one)"
    return HINTS.get(str(problem["kind"]), "")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = _parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    script = script_of(command)
    paths = args.paths or ([script.parent] if script is not None else [])
    if not command and not args.scan_only:
        _parser().error("put the program's command after `--` (or give --scan-only and the paths to scan)")
    spec = _spec(args) if not args.scan_only else ""
    found = run_scan(paths) if paths and not args.no_scan else 0
    if args.scan_only:
        return 1 if found else 0
    from lightning_anyaccel.kit.emulator import AUTOLOAD, ENV_VAR
    from lightning_anyaccel.kit.emulator.build import build
    from lightning_anyaccel.kit.emulator.problems import REPORT_ENV

    build()  # compiled here once, before the program's processes start
    with tempfile.TemporaryDirectory(prefix="anyaccel-emulate-") as folder:
        env = {**os.environ, ENV_VAR: spec, REPORT_ENV: folder,
               "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), *filter(None, [os.environ.get("PYTHONPATH")])])}
        print(f"emulate: running {' '.join(command)!r} on {args.devices} emulated {args.name!r} device(s)", flush=True)
        returncode = _run(command, env, args.timeout)
        reports = []
        for path in sorted(Path(folder).glob("*.json")):
            try:
                reports.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    text, problems = summarize(reports, args.name, returncode)
    print(text)
    if not reports:
        print(f"emulate: no process of the program had the emulated device, so nothing ran on it (exit status"
              f" {returncode or 1}): is the command a Python program with torch? A `python -I`/`-S` interpreter"
              " ignores PYTHONPATH; a process that could not load the device says why above")
        return returncode or 1
    return returncode if returncode else (1 if problems or found else 0)


if __name__ == "__main__":
    sys.exit(main())
