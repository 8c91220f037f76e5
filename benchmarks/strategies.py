"""Every strategy side by side: the plugin's, Lightning's own and a plain PyTorch loop, in one run.

For DDP, FSDP, FSDP2 and DeepSpeed ZeRO stage 2, two processes (one per device; on CPU, two
processes with one thread each; on a machine with one device, one process) train the same model on the same data, batch, threads and
collective backend three ways (see :mod:`benchmarks._strategy_worker`): the package's strategy
(``plugin``), Lightning's own strategy with Lightning's accelerator where Lightning runs on the
device (``lightning``), and a hand-written loop around the same torch/DeepSpeed wrapper (``raw``).
The DDP family adds ``single``: one process, no wrapper, the weak-scaling baseline.

Variants run in interleaved rounds (plugin, lightning, raw, plugin, lightning, raw, ...) inside one
pair of processes, so a change in machine load hits all of them alike; the ratios are formed per
round (plugin/raw, plugin/lightning, lightning/raw) and summarised by median and min–max. A first,
untimed round counts function calls per step under ``cProfile`` (grouped by package), which no
machine load can blur. Every timed run keeps its per-step times, so the report can show how the
spread of the per-round ratios shrinks with the number of timed steps.

The DDP options users reach for (``gradient_as_bucket_view``, ``static_graph``,
``bucket_cap_mb``, comm hooks) are measured in the same processes as ``AnyDDPStrategy`` variants
against the default, on the communication-bound workload where they can matter.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._strategy_worker import FAMILIES, KNOBS
from benchmarks.common import bench_env, processes_possible, run_ranks, summarize
from benchmarks.models import COMM_BOUND, COMPUTE_BOUND, Workload, scaled
from lightning_anyaccel.kit.tools.local_runs import free_port

#: Goals, reported next to each figure and never asserted.
GOAL_PLUGIN_OVER_LIGHTNING = 0.99
#: plugin/raw must reach this fraction of what Lightning's own strategy reaches (lightning/raw).
GOAL_PLUGIN_RAW_OF_LIGHTNING = 0.97
#: Timed-step windows for the spread-versus-steps table (those not above the measured steps).
WINDOWS: tuple[int, ...] = (10, 25, 50, 100, 200)
#: Human names of the families.
FAMILY_LABELS = {"ddp": "DDP", "fsdp": "FSDP", "fsdp2": "FSDP2 (fully_shard)", "deepspeed": "DeepSpeed ZeRO-2"}
PLUGIN_CLASSES = {"ddp": "AnyDDPStrategy", "fsdp": "AnyFSDPStrategy", "fsdp2": "AnyModelParallelStrategy",
                  "deepspeed": "AnyDeepSpeedStrategy(stage=2)"}
LIGHTNING_CLASSES = {"ddp": "DDPStrategy", "fsdp": "FSDPStrategy", "fsdp2": "ModelParallelStrategy",
                     "deepspeed": "DeepSpeedStrategy(stage=2)"}
RAW_WRAPPERS = {"ddp": "DistributedDataParallel", "fsdp": "FullyShardedDataParallel", "fsdp2": "fully_shard",
                "deepspeed": "deepspeed.initialize"}


def _launch(device_type: str, count: int, args: list[str], threads: int, timeout: float) -> dict[str, Any]:
    world = processes_possible(device_type, count)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "strategies.json")
        env = bench_env(threads, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
        run_ranks("benchmarks._strategy_worker", [*args, "--threads", str(threads), "--out", str(out)],
                  world_size=world, timeout=timeout, env=env)
        return json.loads(out.read_text())


def _ratio_rounds(runs: dict[str, list[dict[str, Any]]], a: str, b: str, steps: int | None = None) -> list[float]:
    """Per-round ratio of steps/s a/b (over the first ``steps`` timed steps when given)."""
    def rate(run: dict[str, Any]) -> float:
        times = run["step_s"] if steps is None else run["step_s"][:steps]
        return len(times) / sum(times)

    return [rate(x) / rate(y) for x, y in zip(runs[a], runs[b])]


def _median_step_rate(run: dict[str, Any]) -> float:
    """Steps per second of a run's median step (1 / median step time)."""
    return 1.0 / statistics.median(run["step_s"])


def _verdict(per_round: dict[str, Any], goal: float) -> str:
    """``met``, ``within noise`` (some round reached the goal) or ``not met``."""
    if per_round["median"] >= goal:
        return "met"
    return "within noise" if per_round["max"] >= goal else "not met"


def summarize_family(raw: dict[str, Any], w: Workload, world: int) -> dict[str, Any]:
    """Steps/s, samples/s, per-round ratios, goals and spread-versus-steps of one family's runs."""
    runs: dict[str, list[dict[str, Any]]] = raw["runs"]
    out: dict[str, Any] = {k: raw[k] for k in ("classes", "calls_per_step", "refused", "errors", "threads", "order")
                           if k in raw}
    out["steps_per_s"] = {n: summarize([r["steps_per_s"] for r in rs]) for n, rs in runs.items()}
    out["cpu_steps_per_s"] = {n: summarize([r["cpu_steps_per_s"] for r in rs]) for n, rs in runs.items()}
    out["samples_per_s"] = {n: s["median"] * w.batch * (1 if n == "single" else world)
                            for n, s in out["steps_per_s"].items()}
    ratios: dict[str, Any] = {}
    for a, b in (("plugin", "raw"), ("plugin", "lightning"), ("lightning", "raw"), ("raw+sigterm_broadcast", "raw"),
                 ("plugin", "raw+sigterm_broadcast")):
        if a in runs and b in runs:
            ratios[f"{a}/{b}"] = {
                "per_round": summarize(_ratio_rounds(runs, a, b)),
                "cpu_per_round": summarize([x["cpu_steps_per_s"] / y["cpu_steps_per_s"]
                                            for x, y in zip(runs[a], runs[b])]),
                # the typical step of each run (its median step time): blind to the slow steps a busy or
                # throttled host adds, which the mean-based steps/s counts in full
                "median_step_per_round": summarize([_median_step_rate(x) / _median_step_rate(y)
                                                    for x, y in zip(runs[a], runs[b])]),
            }
    for name in runs:
        if name.startswith("plugin+"):
            ratios[f"{name}/plugin"] = {"per_round": summarize(_ratio_rounds(runs, name, "plugin"))}
    if "single" in runs:  # weak scaling: 2 processes do twice the work per step
        out["efficiency"] = {n: summarize([r["steps_per_s"] / s["steps_per_s"] for r, s in zip(runs[n], runs["single"])])
                             for n in ("plugin", "lightning", "raw") if n in runs}
    out["ratios"] = ratios
    goals: dict[str, Any] = {}
    if "plugin/lightning" in ratios:
        pr = ratios["plugin/lightning"]["per_round"]
        goals["plugin/lightning"] = {"goal": GOAL_PLUGIN_OVER_LIGHTNING, "median": pr["median"], "min": pr["min"],
                                     "max": pr["max"],
                                     "verdict": _verdict(pr, GOAL_PLUGIN_OVER_LIGHTNING)}
    if "plugin/raw" in ratios and "lightning/raw" in ratios:
        # plugin/raw against 0.97 x what Lightning reaches, per round: (plugin/raw) / (lightning/raw)
        rel = summarize([p / q for p, q in zip(ratios["plugin/raw"]["per_round"]["values"],
                                               ratios["lightning/raw"]["per_round"]["values"])])
        goals["plugin/raw vs lightning/raw"] = {"goal": GOAL_PLUGIN_RAW_OF_LIGHTNING, "median": rel["median"],
                                                "min": rel["min"], "max": rel["max"],
                                                "verdict": _verdict(rel, GOAL_PLUGIN_RAW_OF_LIGHTNING)}
    elif "plugin/raw" in ratios:
        goals["plugin/raw vs lightning/raw"] = {
            "goal": GOAL_PLUGIN_RAW_OF_LIGHTNING, "verdict": "no anchor",
            "why": raw.get("refused", {}).get("lightning", "Lightning has no accelerator for this device"),
        }
    out["goals"] = goals
    measured = min((len(r["step_s"]) for rs in runs.values() for r in rs), default=0)
    spread: dict[str, Any] = {}
    for pair in ("plugin/raw", "plugin/lightning"):
        a, b = pair.split("/")
        if a in runs and b in runs and len(runs[a]) >= 2:
            rows = {}
            for n in (*[x for x in WINDOWS if x < measured], measured):
                s = summarize(_ratio_rounds(runs, a, b, n))
                rows[str(n)] = {"median": s["median"], "min": s["min"], "max": s["max"],
                                "range_rel": (s["max"] - s["min"]) / s["median"]}
            spread[pair] = rows
    out["spread_vs_steps"] = spread
    # step-to-step variation inside runs: the noise a single long run averages away
    cv = [statistics.pstdev(r["step_s"]) / statistics.mean(r["step_s"]) for rs in runs.values() for r in rs
          if len(r["step_s"]) > 1]
    out["step_cv_median"] = statistics.median(cv) if cv else None
    return out


def run(device_type: str, device_count: int, *, workload: Workload = COMPUTE_BOUND, scale: float = 1.0,
        warmup: int = 5, measure: int = 100, rounds: int = 5, profile_measure: int = 10, threads: int = 1,
        families: tuple[str, ...] = FAMILIES, knobs: tuple[str, ...] = tuple(KNOBS),
        knob_workload: Workload = COMM_BOUND, knob_scale: float = 1.0, knob_measure: int = 30, knob_rounds: int = 3,
        timeout: float = 1800) -> dict[str, Any]:
    """Run every family's variants, then the DDP options, in one pair of processes; return the ``strategies`` section.

    ``knobs=()`` leaves the DDP options out.
    """
    world = processes_possible(device_type, device_count)
    w = scaled(workload, scale) if scale != 1.0 else workload
    kw = scaled(knob_workload, knob_scale) if knob_scale != 1.0 else knob_workload
    result: dict[str, Any] = {
        "workload": w.describe(),
        "settings": {"processes": world, "threads_per_process": threads, "rounds": rounds, "warmup_steps": warmup,
                     "measured_steps": measure, "profiled_steps": profile_measure},
        "goals": {"plugin/lightning": GOAL_PLUGIN_OVER_LIGHTNING,
                  "plugin/raw vs lightning/raw": GOAL_PLUGIN_RAW_OF_LIGHTNING},
        "families": {},
    }
    if world < 1:
        result["skipped"] = f"needs a {device_type} device, found none"
        return result
    if world == 1:  # one device: every strategy as 1 process on it (its code path per step, no scaling)
        result["one_device"] = (f"this machine has 1 {device_type} device: every strategy runs as 1 process on it,"
                                " which measures each strategy's per-step cost, not scaling")
    if "deepspeed" in families and importlib.util.find_spec("deepspeed") is None:
        families = tuple(f for f in families if f != "deepspeed")
        result["families"]["deepspeed"] = {"skipped": "deepspeed is not installed: pip install lightning-anyaccel[deepspeed]"}
    run_families = (*families, "knobs") if knobs else families
    data = _launch(device_type, device_count, [
        "--families", ",".join(run_families), "--workload", w.name, "--scale", str(scale), "--warmup", str(warmup),
        "--measure", str(measure), "--rounds", str(rounds), "--profile-measure", str(profile_measure),
        "--knobs", ",".join(knobs), "--knob-workload", kw.name, "--knob-scale", str(knob_scale),
        "--knob-measure", str(knob_measure), "--knob-rounds", str(knob_rounds),
    ], threads, timeout)
    result["backend"], result["device"] = data["backend"], data["device"]
    for family, raw in data["families"].items():
        fw = kw if family == "knobs" else w
        summary = summarize_family(raw, fw, world) if raw.get("runs") else {
            k: raw[k] for k in ("refused", "errors", "calls_per_step") if k in raw}
        if family != "knobs":
            result["families"][family] = summary
            continue
        result["knobs"] = {
            "workload": kw.describe(),
            "settings": {"processes": world, "threads_per_process": threads, "rounds": knob_rounds,
                         "warmup_steps": warmup, "measured_steps": knob_measure},
            "options": {k: {key: (v if key != "ddp_comm_hook" else f"default_hooks.{v}_compress_hook")
                            for key, v in KNOBS[k].items()} for k in knobs},
            "ddp": summary,
        }
    return result
