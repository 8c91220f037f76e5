"""A transformer users recognise: GPT-2 training throughput (tokens/s, model FLOPs utilisation).

One process, one device, bf16-mixed where the device supports it. Three variants train the same
Hugging Face ``GPT2LMHeadModel`` (built from its config, nothing downloaded) on the same random
token batches: the package's ``AnyAccelerator`` with ``any_single``, Lightning's own accelerator
for the device type (``cpu``, ``cuda``; skipped where Lightning has none) with its automatic
strategy, and a plain PyTorch loop. Repetitions are interleaved (A B C A B C ...), as in
:mod:`benchmarks.overhead`, and the goal is the same: the median of the per-round
plugin/Lightning ratios >= 0.99.

Sizes: :data:`SIZES`. ``"auto"`` picks ``gpt2-small-1k`` (124 M parameters, 16 x 1024 tokens per
step: GPT-2's own context length) on an accelerator, so that a step is bound by the device and not by
Python, and ``cpu-small`` (2 blocks of width 128, 8 x 64 tokens) on CPU, to keep ``make bench`` near
10 minutes. Whether the step really is device-bound is measured, not assumed: one extra run of the
plugin variant under ``torch.profiler`` (:func:`device_busy`) sums the device's kernel time over a
few steps and divides it by their wall-clock time.

``torch.compile``: where Inductor has a code generator for the device
(:func:`lightning_anyaccel.device.compilation.inductor_supports`), two more variants train the same
model compiled — the plugin's Trainer with the GPT-2 module compiled by
:func:`lightning_anyaccel.compile`, and the plain loop with ``torch.compile`` — interleaved with
each other after the eager rounds, so the page shows compiled tokens/s beside the eager ones.

Model FLOPs utilisation (MFU) is ``6 N + 12 L d T`` FLOPs per token (N parameters, L blocks,
width d, T tokens per sequence: forward and backward, attention included) times tokens/s, over
the device's peak dense bf16 throughput where :data:`PEAK_BF16_TFLOPS` knows the device.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from lightning.pytorch import Callback

from benchmarks.common import interleave, now, plugin_ratios, quiet_bench, summarize, synchronize
from benchmarks.models import StepTimer

#: Goal for the median of per-round plugin/built-in ratios; reported, never asserted.
GOAL = 0.99

#: Peak dense bf16 tensor throughput (TFLOP/s) by a substring of the device name, from the
#: vendors' data sheets (without sparsity). Devices not listed get no MFU.
PEAK_BF16_TFLOPS: dict[str, float] = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,  # SXM (checked after "H100 PCIe")
    "A100": 312.0,
    "L40S": 362.0,
    "MI300X": 1307.0,
}


@dataclass(frozen=True)
class TransformerSize:
    """A GPT-2 configuration and the batch it trains on."""

    name: str
    layers: int
    width: int
    heads: int
    seq: int
    batch: int
    vocab: int = 50257

    @property
    def tokens_per_step(self) -> int:
        return self.seq * self.batch


SIZES: dict[str, TransformerSize] = {
    "gpt2-small-1k": TransformerSize("gpt2-small-1k", layers=12, width=768, heads=12, seq=1024, batch=16),
    "gpt2-small": TransformerSize("gpt2-small", layers=12, width=768, heads=12, seq=512, batch=8),
    "cpu-small": TransformerSize("cpu-small", layers=2, width=128, heads=4, seq=64, batch=8, vocab=4096),
    "tiny": TransformerSize("tiny", layers=1, width=32, heads=2, seq=16, batch=2, vocab=256),
}


def pick_size(name: str, device_type: str) -> TransformerSize:
    """``"auto"``: ``cpu-small`` on CPU, ``gpt2-small-1k`` on an accelerator; else the size of that name.

    >>> pick_size("auto", "cpu").name
    'cpu-small'
    """
    if name == "auto":
        return SIZES["cpu-small" if device_type == "cpu" else "gpt2-small-1k"]
    return SIZES[name]


def build_model(size: TransformerSize) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=size.vocab, n_positions=size.seq, n_embd=size.width, n_layer=size.layers,
                        n_head=size.heads, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def flops_per_token(size: TransformerSize, params: int) -> float:
    """Training FLOPs per token: ``6 N`` for the weights plus ``12 L d T`` for attention scores."""
    return 6.0 * params + 12.0 * size.layers * size.width * size.seq


def peak_tflops(device_type: str) -> tuple[str | None, float | None]:
    """(device name, peak dense bf16 TFLOP/s) where the name is in :data:`PEAK_BF16_TFLOPS`."""
    if device_type == "cpu":
        return None, None
    module = torch.get_device_module(device_type)
    name = module.get_device_name() if hasattr(module, "get_device_name") else None
    for key, value in PEAK_BF16_TFLOPS.items():
        if name and key in name:
            return name, value
    return name, None


def _tokens(size: TransformerSize, steps: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, size.vocab, (steps * size.batch, size.seq), generator=g)


def _module(size: TransformerSize, compiled: bool = False) -> Any:
    from lightning.pytorch import LightningModule

    class GPT2Bench(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            model = build_model(size)
            if compiled:
                from lightning_anyaccel import compile as compile_for_device

                model = compile_for_device(model, device_type=_DEVICE_TYPE[0], fallback=False)
            self.model = model

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    return GPT2Bench()


#: The device type of the running benchmark, for the compiled module (set by :func:`run`).
_DEVICE_TYPE: list[str] = ["cpu"]


class DeviceBusy(Callback):
    """A Lightning callback that profiles steps ``start .. start+steps-1`` and reports the device's busy share.

    ``busy`` is the summed self time of the device's kernels and copies (``torch.profiler``, with
    the device's profiler activity from the device table) over the wall-clock time of those steps,
    the device synchronised at both ends: near 1 when the device never waits for the host (the
    step is bound by the device), well below 1 when Python launches work slower than it runs.
    """

    def __init__(self, activity: str, start: int, steps: int) -> None:
        super().__init__()
        self.activity, self.start, self.steps = activity, start, steps
        self.busy: float | None = None
        self._prof: Any = None
        self._t0 = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.start:
            from torch.profiler import ProfilerActivity, profile

            synchronize(pl_module.device)
            self._prof = profile(activities=[getattr(ProfilerActivity, self.activity)])
            self._prof.__enter__()
            self._t0 = now()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.start + self.steps - 1 and self._prof is not None:
            synchronize(pl_module.device)
            wall = now() - self._t0
            self._prof.__exit__(None, None, None)
            device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in self._prof.key_averages())
            self.busy = device_us / 1e6 / wall


def _fit(accelerator: Any, strategy: Any, size: TransformerSize, precision: str, warmup: int, measure: int,
         seed: int, compiled: bool = False, busy: DeviceBusy | None = None) -> tuple[tuple[float, float], str]:
    from lightning.pytorch import Trainer
    from torch.utils.data import DataLoader

    torch.manual_seed(seed)
    timer = StepTimer(warmup, measure)
    callbacks: list[Callback] = [timer] + ([busy] if busy is not None else [])
    trainer = Trainer(
        accelerator=accelerator, strategy=strategy, devices=1, precision=precision, max_steps=warmup + measure,
        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=callbacks,
    )
    trainer.fit(_module(size, compiled), DataLoader(_tokens(size, warmup + measure, seed), batch_size=size.batch))
    return (timer.steps_per_s, timer.cpu_steps_per_s), f"{type(trainer.accelerator).__name__}/{type(trainer.strategy).__name__}"


def plain_loop(size: TransformerSize, device: torch.device, precision: str, warmup: int, measure: int,
               seed: int = 0, compiled: bool = False) -> tuple[float, float]:
    """(steps/s, steps per CPU-second) of a hand-written loop doing the Lightning variants' work."""
    torch.manual_seed(seed)
    model = build_model(size).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if compiled:
        model = torch.compile(model)
    autocast = precision == "bf16-mixed"
    start = cpu_start = 0.0
    for i, batch in enumerate(_tokens(size, warmup + measure, seed).split(size.batch)):
        if i == warmup:
            synchronize(device)
            start, cpu_start = now(), time.process_time()
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return measure / (now() - start), measure / (time.process_time() - cpu_start)


def _logged(variants: dict[str, Any], log: Any) -> dict[str, Any]:
    """``variants`` with each run's steps/s logged (a long GPU run shows its progress)."""
    def wrap(name: str, fn: Any) -> Any:
        def logged(seed: int) -> tuple[float, float]:
            wall, cpu = fn(seed)
            log(f"[bench] transformer round {seed}: {name} {wall:.3f} steps/s")
            return wall, cpu
        return logged
    return {name: wrap(name, fn) for name, fn in variants.items()}


def run(device_type: str, *, reps: int = 6, warmup: int = 5, measure: int = 30, size: str = "auto",
        threads: int = 1, compiled_reps: int = 0, log: Any = print) -> dict[str, Any]:
    """Run the interleaved comparison and return the ``transformer`` section of the results file.

    ``compiled_reps`` rounds of the two compiled variants follow, where Inductor compiles for the
    device (0: none).
    """
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return {"skipped": "transformers is not installed (pip install lightning-anyaccel[workloads])"}
    import transformers

    from lightning_anyaccel import AnyAccelerator
    from lightning_anyaccel.device.compilation import inductor_supports
    from lightning_anyaccel.device.devices import device_of, get_spec

    transformers.logging.set_verbosity_error()
    quiet_bench()
    torch.set_num_threads(threads)
    spec = get_spec(device_type)
    chosen = pick_size(size, device_type)
    precision = "bf16-mixed" if spec.supports_precision("bf16-mixed") else "32-true"
    builtin = spec.lightning_builtin
    device = device_of(device_type)
    _DEVICE_TYPE[0] = device_type
    classes: dict[str, str] = {}

    def plugin(seed: int) -> tuple[float, float]:
        sps, classes["plugin"] = _fit(AnyAccelerator(device_type), "any_single", chosen, precision, warmup, measure,
                                      seed)
        return sps

    def lightning_builtin(seed: int) -> tuple[float, float]:
        sps, classes["builtin"] = _fit(builtin, "auto", chosen, precision, warmup, measure, seed)
        return sps

    def plain(seed: int) -> tuple[float, float]:
        classes["plain"] = "torch loop"
        return plain_loop(chosen, device, precision, warmup, measure, seed)

    variants = {"plugin": plugin, **({"builtin": lightning_builtin} if builtin else {}), "plain": plain}
    for fn in variants.values():  # one untimed round: first-use costs (allocator, kernels) land here
        fn(0)
    samples, cpu_samples, order = interleave(_logged(variants, log), reps, first=1)

    busy: dict[str, Any] = {}
    if spec.profiler_activity and not spec.host:  # one more plugin run, under the profiler (untimed)
        probe = DeviceBusy(spec.profiler_activity, start=warmup, steps=min(5, measure))
        try:
            _fit(AnyAccelerator(device_type), "any_single", chosen, precision, warmup, measure, 0, busy=probe)
            busy = {"plugin": probe.busy, "steps": probe.steps}
        except Exception as err:  # the profiler is optional evidence: never lose the timings over it
            busy = {"error": f"{type(err).__name__}: {err}"}
        log(f"[bench] transformer: device busy {busy}")

    compiled: dict[str, Any] = {}
    if compiled_reps and not inductor_supports(device_type):
        compiled = {"skipped": f"Inductor has no code generator for {device_type!r} (docs/limitations.md)"}
    elif compiled_reps:
        def plugin_compiled(seed: int) -> tuple[float, float]:
            sps, classes["plugin_compiled"] = _fit(AnyAccelerator(device_type), "any_single", chosen, precision,
                                                   warmup, measure, seed, compiled=True)
            return sps

        def plain_compiled(seed: int) -> tuple[float, float]:
            classes["plain_compiled"] = "torch loop, torch.compile"
            return plain_loop(chosen, device, precision, warmup, measure, seed, compiled=True)

        compiled_variants = {"plugin_compiled": plugin_compiled, "plain_compiled": plain_compiled}
        started = now()
        for fn in compiled_variants.values():  # compiles (untimed)
            fn(0)
        compile_s = now() - started
        c_samples, c_cpu, c_order = interleave(_logged(compiled_variants, log), compiled_reps, first=1)
        compiled = {
            "reps": compiled_reps, "order": c_order, "first_round_s": round(compile_s, 1),
            "steps_per_s": {name: summarize(vals) for name, vals in c_samples.items()},
            "tokens_per_s": {name: summarize([v * chosen.tokens_per_step for v in vals])
                             for name, vals in c_samples.items()},
            "compiled_over_eager": {
                "plugin": summarize(c_samples["plugin_compiled"])["median"] / summarize(samples["plugin"])["median"],
                "plain": summarize(c_samples["plain_compiled"])["median"] / summarize(samples["plain"])["median"],
            },
        }

    params = sum(p.numel() for p in build_model(chosen).parameters())
    device_name, peak = peak_tflops(device_type)
    per_token = flops_per_token(chosen, params)
    tokens_per_s = {name: summarize([s * chosen.tokens_per_step for s in vals]) for name, vals in samples.items()}
    result: dict[str, Any] = {
        "workload": {**asdict(chosen), "params": params, "precision": precision,
                     "flops_per_token": per_token},
        "settings": {"reps": reps, "warmup_steps": warmup, "measured_steps": measure, "threads": threads},
        "order": order,
        "classes": classes,
        "builtin_accelerator": builtin,
        "device_name": device_name,
        "peak_bf16_tflops": peak,
        "steps_per_s": {name: summarize(vals) for name, vals in samples.items()},
        "tokens_per_s": tokens_per_s,
        "mfu": ({name: t["median"] * per_token / (peak * 1e12) for name, t in tokens_per_s.items()}
                if peak else None),
        "goal_plugin_over_builtin": GOAL,
        "ratios": plugin_ratios(samples, cpu_samples),
        "device_busy": busy,
        "compiled": compiled,
    }
    if compiled.get("tokens_per_s") and peak:
        compiled["mfu"] = {name: t["median"] * per_token / (peak * 1e12) for name, t in compiled["tokens_per_s"].items()}
    if "builtin" in samples:
        result["goal_met"] = result["ratios"]["plugin/builtin"]["per_round"]["median"] >= GOAL
    else:
        result["builtin_skipped"] = f"Lightning has no built-in accelerator for {device_type!r}"
    return result
