"""Run every benchmark on this machine's device and write one results file (then plots + docs page).

    python -m benchmarks                 # defaults (9 min on 2 idle CPU cores, 22 at load 9-16)
    python -m benchmarks --quick         # smaller sizes, fewer repetitions (a few minutes)
    python -m benchmarks --only overhead,strategies --no-report
    python -m benchmarks --device emulated:npu   # on the emulated device (lightning_anyaccel.kit.emulator)
    python -m benchmarks --set strategy_measure=300 --set overhead_measure=400   # longer runs (fast devices)

The device is the one :func:`lightning_anyaccel.detect_device_type` reports (CPU when there is no
accelerator). A results file holds one run on one machine; ratios are only ever formed inside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, SCHEMA, load_average, metadata, results_for, write_json

SECTIONS: tuple[str, ...] = ("overhead", "transformer", "strategies", "collective", "first_step", "device_calls")
#: ``--device emulated:NAME``: the emulated PrivateUse1 device (``lightning_anyaccel.kit.emulator``), loaded
#: in every process of the run by this folder on ``PYTHONPATH`` and ``$LIGHTNING_ANYACCEL_EMULATE``.
EMULATOR_AUTOLOAD = ROOT / "src" / "lightning_anyaccel" / "kit" / "emulator" / "autoload"
EMULATE_ENV = "LIGHTNING_ANYACCEL_EMULATE"


@dataclass(frozen=True)
class Settings:
    """Sizes and repetition counts for one run of all benchmarks."""

    mode: str = "default"
    overhead_reps: int = 20
    overhead_warmup: int = 10
    overhead_measure: int = 150
    transformer_reps: int = 20  # enough rounds for the median's interval to exclude the goal at ~3 % noise
    transformer_warmup: int = 5
    transformer_measure: int = 60
    transformer_size: str = "auto"  # benchmarks.transformer.SIZES: gpt2-small-1k on accelerators, cpu-small on CPU
    transformer_compiled_reps: int = 5  # rounds of the torch.compile variants (where Inductor compiles); 0: none
    strategy_rounds: int = 6  # the fewest rounds that give the median a 95 % interval (report.median_ci)
    strategy_warmup: int = 5
    strategy_measure: int = 50
    strategy_scale: float = 1.0
    knob_rounds: int = 3
    knob_measure: int = 20
    knob_scale: float = 1.0
    knobs: tuple[str, ...] = ()  # () = every option of _strategy_worker.KNOBS
    collective_sizes: tuple[int, ...] = ()  # () = collective.DEFAULT_SIZES
    collective_trials: int = 3
    first_step_reps: int = 2
    first_step_scale: float = 1.0
    first_step_methods: tuple[str, ...] = ("popen", "spawn", "fork")


QUICK = Settings(mode="quick", overhead_reps=6, overhead_measure=60, transformer_reps=2, transformer_measure=10,
                 transformer_compiled_reps=0,
                 strategy_rounds=2, strategy_measure=20,
                 strategy_scale=0.5, knob_rounds=1, knob_measure=5, knob_scale=0.5,
                 collective_sizes=(4096, 262144, 4194304), collective_trials=2, first_step_reps=1)
#: For the smoke test: every code path, tiny sizes, seconds not minutes.
TINY = Settings(mode="tiny", overhead_reps=1, overhead_warmup=2, overhead_measure=3, transformer_reps=1,
                transformer_compiled_reps=0,
                transformer_warmup=1, transformer_measure=2, transformer_size="tiny", strategy_rounds=1,
                strategy_warmup=1, strategy_measure=3, strategy_scale=0.05, knob_rounds=1, knob_measure=2,
                knob_scale=0.05, knobs=("static_graph",), collective_sizes=(4096, 65536), collective_trials=1,
                first_step_reps=1, first_step_scale=0.1, first_step_methods=("fork",))


def run_all(settings: Settings, sections: tuple[str, ...] = SECTIONS, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the chosen benchmark sections and return the results document (not yet written)."""
    import torch

    from benchmarks import collective, device_calls, first_step, overhead, strategies, transformer
    from benchmarks.models import OVERHEAD, scaled
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec

    device_type = runtime.detect_device_type()
    count = runtime.device_count(get_spec(device_type))
    doc: dict[str, Any] = {"schema": SCHEMA, "meta": metadata(device_type)}
    doc["meta"]["settings"] = asdict(settings)
    doc["meta"]["load_average_before"] = load_average()
    threads_before = torch.get_num_threads()
    started = time.perf_counter()
    tiny = settings.mode == "tiny"
    jobs: dict[str, Callable[[], dict[str, Any]]] = {
        "overhead": lambda: overhead.run(
            device_type, reps=settings.overhead_reps, warmup=settings.overhead_warmup,
            measure=settings.overhead_measure, workload=scaled(OVERHEAD, 0.1) if tiny else OVERHEAD),
        "transformer": lambda: transformer.run(
            device_type, reps=settings.transformer_reps, warmup=settings.transformer_warmup,
            measure=settings.transformer_measure, size=settings.transformer_size,
            compiled_reps=settings.transformer_compiled_reps, log=log),
        "strategies": lambda: strategies.run(
            device_type, count, rounds=settings.strategy_rounds, warmup=settings.strategy_warmup,
            measure=settings.strategy_measure, scale=settings.strategy_scale,
            profile_measure=min(10, settings.strategy_measure), knob_rounds=settings.knob_rounds,
            knob_measure=settings.knob_measure, knob_scale=settings.knob_scale,
            **({"knobs": settings.knobs} if settings.knobs else {})),
        "collective": lambda: collective.run(
            device_type, count, sizes=settings.collective_sizes or collective.DEFAULT_SIZES,
            trials=settings.collective_trials),
        "device_calls": lambda: device_calls.run(
            device_type, **({"self_check": True, "warmup": 2, "measure": 3, "workload": scaled(OVERHEAD, 0.1)}
                            if tiny else {})),
        "first_step": lambda: first_step.run(device_type, count, reps=settings.first_step_reps,
                                             scale=settings.first_step_scale, methods=settings.first_step_methods),
    }
    for name in sections:
        log(f"[bench] {name} on {device_type} ({settings.mode}) ...")
        t = time.perf_counter()
        try:
            doc[name] = jobs[name]()
        except Exception as err:  # one failing section must not lose the others' numbers
            doc[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            log(f"[bench] {name} FAILED: {err}")
        doc[name]["runtime_s"] = round(time.perf_counter() - t, 1)
        doc[name]["run"] = {"date": doc["meta"]["date"], "source": doc["meta"].get("source")}
        doc[name]["load_average_after"] = load_average()
        log(f"[bench] {name} done in {doc[name]['runtime_s']} s")
    torch.set_num_threads(threads_before)
    doc["meta"]["runtime_s"] = round(time.perf_counter() - started, 1)
    doc["meta"]["load_average_after"] = load_average()
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions (a few minutes)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file to write (default: benchmarks/results/<device type>.json)")
    parser.add_argument("--no-report", action="store_true",
                        help="do not render plots and the device's page (docs/benchmarks.md for CPU)")
    parser.add_argument("--device", default=None,
                        help="emulated:NAME runs everything on the emulated device NAME (lightning_anyaccel.kit.emulator);"
                             " otherwise the device torch.accelerator reports (give its type to check it)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other sections of an existing results file (same device type): the page then"
                             " says which run each section comes from")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override one field of the mode's Settings (e.g. strategy_measure=300); repeatable")
    args = parser.parse_args(argv)
    if args.device:
        _select_device(parser, args.device, sys.argv[1:] if argv is None else argv)
    sections = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    settings = _override(parser, QUICK if args.quick else Settings(), args.set)
    doc = run_all(settings, sections)
    doc["meta"]["overrides"] = list(args.set)  # the --set fields, to reproduce the run
    if args.out is None:
        args.out = results_for(doc["meta"]["device"]["type"])
    if args.merge and args.out.exists():
        doc = merged(json.loads(args.out.read_text()), doc)
    write_json(args.out, doc)
    print(f"[bench] wrote {args.out} ({doc['meta']['runtime_s']} s)")
    if not args.no_report:
        from benchmarks import report

        for path in report.render(args.out):
            print(f"[bench] wrote {path}")
    failed = [name for name in sections if "error" in doc.get(name, {})]
    if failed:
        print(f"[bench] FAILED sections: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def merged(earlier: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the sections it did not run taken from ``earlier`` (a results file of the same device type).

    Each section keeps the ``run`` (date, commit) it was measured in; the metadata is ``doc``'s.

    Raises:
        ValueError: ``earlier`` is another schema or another device type.
    """
    if earlier.get("schema") != doc["schema"] or earlier["meta"]["device"]["type"] != doc["meta"]["device"]["type"]:
        raise ValueError("--merge: the existing results file is of another schema or device type")
    kept = {name: earlier[name] for name in SECTIONS if name in earlier and name not in doc}
    for name, section in kept.items():
        section.setdefault("run", {"date": earlier["meta"]["date"], "source": earlier["meta"].get("source")})
    corrections = earlier["meta"].get("corrections", []) if kept else []
    meta = {**doc["meta"], **({"corrections": corrections} if corrections else {})}
    return {**doc, **kept, "meta": meta}


def _override(parser: argparse.ArgumentParser, settings: Settings, pairs: list[str]) -> Settings:
    """``settings`` with ``NAME=VALUE`` fields replaced (ints, floats, comma-separated tuples), checked by name.

    >>> _override(argparse.ArgumentParser(), Settings(), ["strategy_measure=300"]).strategy_measure
    300
    """
    changes: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        current = getattr(settings, name.strip(), None) if sep else None
        if current is None or name.strip() == "mode":
            parser.error(f"--set {pair!r}: give NAME=VALUE with NAME one of "
                         + ", ".join(f for f in asdict(settings) if f != "mode"))
        kind = type(current)
        try:
            if kind is tuple:
                items = [v.strip() for v in value.split(",") if v.strip()]
                changes[name.strip()] = tuple(int(v) if v.lstrip("-").isdigit() else v for v in items)
            else:
                changes[name.strip()] = kind(value)
        except ValueError:
            parser.error(f"--set {pair!r}: {value!r} is not a {kind.__name__}")
    return replace(settings, **changes)


def _select_device(parser: argparse.ArgumentParser, device: str, argv: list[str]) -> None:
    """Load the emulated device in this and every child process (re-running this command), or check the type.

    The emulator must exist before torch picks its accelerator, and in every process the
    benchmarks start, so ``emulated:NAME`` sets ``$LIGHTNING_ANYACCEL_EMULATE`` and puts
    the emulator's autoload folder on ``PYTHONPATH``, then runs the same command again.
    """
    import os

    if device.startswith("emulated:"):
        name = device.split(":", 1)[1]
        if not EMULATOR_AUTOLOAD.is_dir():
            parser.error(f"--device {device}: the emulated device is not in this checkout ({EMULATOR_AUTOLOAD}"
                         " missing); run on CPU or on a real accelerator without --device")
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if os.environ.get(EMULATE_ENV) != name or str(EMULATOR_AUTOLOAD) not in paths:
            os.environ[EMULATE_ENV] = name
            os.environ["PYTHONPATH"] = os.pathsep.join([str(EMULATOR_AUTOLOAD), *filter(None, paths)])
            os.execv(sys.executable, [sys.executable, "-m", "benchmarks", *argv])
        device = name.partition(":")[0]  # "npu:1": one emulated device of type npu
    from lightning_anyaccel.device import runtime  # after the re-run: torch must see the emulator's device

    found = runtime.detect_device_type()
    if found != device:
        parser.error(f"--device {device}: torch reports {found!r} as this process's device; the benchmarks measure"
                     " the device torch.accelerator reports (leave --device out, or use emulated:NAME)")


if __name__ == "__main__":
    sys.exit(main())
