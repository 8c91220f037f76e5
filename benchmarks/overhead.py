"""Plugin overhead: ``AnyAccelerator`` vs Lightning's built-in accelerator vs a plain PyTorch loop.

One process, one device. The three variants train the same :class:`~benchmarks.models.BenchModule`
on the same data; repetitions are interleaved (A B C A B C ...) so that a change in machine load
hits all variants alike. Only steady-state steps are timed (a warm-up is skipped), so Trainer
construction and setup are excluded.

The built-in variant uses the accelerator named by the device table's ``lightning_builtin``
field (``"cpu"`` -> ``CPUAccelerator``, ``"cuda"`` -> ``CUDAAccelerator``) with Lightning's
automatic strategy; device types Lightning has no accelerator for (xpu, hpu, ...) skip it.
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import timeit
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import interleave, plugin_ratios, quiet_bench, summarize
from benchmarks.models import OVERHEAD, BenchModule, ProfiledSteps, StepTimer, Workload, make_loader, plain_loop

#: Goal for the median of per-round plugin/built-in ratios; reported, never asserted.
GOAL = 0.99


def _fit(accelerator: Any, strategy: Any, w: Workload, warmup: int, measure: int,
         seed: int, count_calls: bool = False, profiled: bool = False) -> tuple[tuple[float, float], str]:
    """Train one Trainer for ``warmup + measure`` steps; return ((steps/s, steps/CPU-s), class names).

    With ``count_calls`` the first number is function calls per step instead (profiled, not timed).
    ``profiled``: under Lightning's ``PyTorchProfiler`` (what ``profiler="pytorch"`` builds), its report and
    trace written to a temporary folder.
    """
    import tempfile

    from lightning.pytorch import Trainer
    from lightning.pytorch.profilers import PyTorchProfiler

    torch.manual_seed(seed)
    timer = ProfiledSteps(warmup, measure) if count_calls else StepTimer(warmup, measure)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as folder:
        trainer = Trainer(
            accelerator=accelerator, strategy=strategy, devices=1, max_steps=warmup + measure, max_epochs=1,
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, callbacks=[timer],
            profiler=PyTorchProfiler(dirpath=folder, filename="report") if profiled else None,
        )
        trainer.fit(BenchModule(w), make_loader(w, warmup + measure, seed))
    if isinstance(timer, ProfiledSteps):
        numbers = (timer.calls_per_step, 0.0)
    else:
        numbers = (timer.steps_per_s, timer.cpu_steps_per_s)
    return numbers, f"{type(trainer.accelerator).__name__}/{type(trainer.strategy).__name__}"


def watchdog_cost(plugin_steps_per_s: float, calls_per_step: float) -> dict[str, float]:
    """The stall watchdog's per-step cost: its counter's calls per step times the time of one call, as a share of a step.

    The watchdog's thread wakes every few seconds and costs nothing per step; what a step pays is
    :func:`~lightning_anyaccel.cluster.watchdog.progress` (one integer increment) at each batch, backward
    and collective.
    """
    from lightning_anyaccel.cluster import watchdog

    number = 200_000
    seconds = min(timeit.repeat(watchdog.progress, number=number, repeat=5)) / number
    share = calls_per_step * seconds * plugin_steps_per_s
    return {"progress_calls_per_step": calls_per_step, "ns_per_call": seconds * 1e9, "share_of_step": share,
            "ratio_plugin_without/with": 1 / (1 - share)}


def _progress_calls(w: Workload, seed: int) -> float:
    """How many times the watchdog's counter moves per step of the plugin variant (one short fit)."""
    from lightning_anyaccel import AnyAccelerator
    from lightning_anyaccel.cluster import watchdog

    before = watchdog._counter[0]
    _fit(AnyAccelerator("cpu"), "any_single", w, 0, 20, seed)
    return (watchdog._counter[0] - before) / 20


def profiler_sessions(fit: Callable[[], Any]) -> int:
    """How many ``torch.profiler`` sessions ``fit()`` started (the plugin without ``profiler=`` must start none)."""
    started = [0]
    original = torch.profiler.profile.start

    def start(self: Any) -> None:
        started[0] += 1
        original(self)

    torch.profiler.profile.start = start  # type: ignore[method-assign]
    try:
        fit()
    finally:
        torch.profiler.profile.start = original  # type: ignore[method-assign]
    return started[0]


def run(device_type: str, *, reps: int = 20, warmup: int = 10, measure: int = 150,
        workload: Workload = OVERHEAD, threads: int = 1) -> dict[str, Any]:
    """Run the interleaved comparison and return the ``overhead`` section of the results file."""
    from lightning_anyaccel import AnyAccelerator
    from lightning_anyaccel.device.devices import device_of, get_spec

    quiet_bench()
    torch.set_num_threads(threads)
    builtin = get_spec(device_type).lightning_builtin
    device = device_of(device_type)
    classes: dict[str, str] = {}

    def plugin(seed: int, count_calls: bool = False) -> tuple[float, float]:
        sps, classes["plugin"] = _fit(AnyAccelerator(device_type), "any_single", workload, warmup, measure, seed,
                                      count_calls)
        return sps

    def plugin_profiled(seed: int, count_calls: bool = False) -> tuple[float, float]:
        sps, classes["plugin+profiler"] = _fit(AnyAccelerator(device_type), "any_single", workload, warmup, measure,
                                               seed, count_calls, profiled=True)
        return sps

    def lightning_builtin(seed: int, count_calls: bool = False) -> tuple[float, float]:
        sps, classes["builtin"] = _fit(builtin, "auto", workload, warmup, measure, seed, count_calls)
        return sps

    def plain(seed: int, count_calls: bool = False) -> tuple[float, float]:
        classes["plain"] = "torch loop"
        if count_calls:
            profile = cProfile.Profile()
            plain_loop(workload, device, warmup, measure, seed, profile=profile)
            return pstats.Stats(profile).total_calls / measure, 0.0  # type: ignore[attr-defined]
        return plain_loop(workload, device, warmup, measure, seed)

    variants: dict[str, Callable[..., tuple[float, float]]] = {"plugin": plugin}
    if builtin is not None:
        variants["builtin"] = lightning_builtin
    variants["plain"] = plain
    variants["plugin+profiler"] = plugin_profiled  # what asking for the profiler costs, beside what not asking does

    # one untimed round (first-use costs land here) that counts function calls per step:
    # deterministic, so machine load cannot blur it
    calls = {name: fn(0, count_calls=True)[0] for name, fn in variants.items()}
    samples, cpu_samples, order = interleave(variants, reps)

    result: dict[str, Any] = {
        "workload": workload.describe(),
        "settings": {"reps": reps, "warmup_steps": warmup, "measured_steps": measure, "threads": threads},
        "order": order,
        "classes": classes,
        "builtin_accelerator": builtin,
        "steps_per_s": {name: summarize(vals) for name, vals in samples.items()},
        "cpu_steps_per_s": {name: summarize(vals) for name, vals in cpu_samples.items()},
        "calls_per_step": calls,
        "goal_plugin_over_builtin": GOAL,
        "ratios": plugin_ratios(samples, cpu_samples),
    }
    for other in ("builtin", "plain"):
        if other in samples:
            result["ratios"][f"plugin/{other}"]["calls_per_step"] = calls["plugin"] / calls[other]
    # no profiler work unless asked: torch.profiler sessions one short fit of each plugin variant starts
    result["profiler_sessions"] = {name: profiler_sessions(functools.partial(variants[name], 0))
                                   for name in ("plugin", "plugin+profiler")}
    result["watchdog"] = watchdog_cost(result["steps_per_s"]["plugin"]["median"], _progress_calls(workload, 0))
    if "builtin" in samples:
        result["goal_met"] = result["ratios"]["plugin/builtin"]["per_round"]["median"] >= GOAL
    else:
        result["builtin_skipped"] = f"Lightning has no built-in accelerator for {device_type!r}"
    return result
