"""One rank of the strategy side-by-side benchmark (run by :mod:`benchmarks.strategies`, 127.0.0.1 only).

Both ranks are started once, join one process group (the device's backend), and then run, for
each strategy family (``ddp``, ``fsdp``, ``fsdp2``, ``deepspeed``), interleaved rounds of its
variants on the same model, data, batch and threads:

- ``plugin``: a ``Trainer`` with :class:`~lightning_anyaccel.AnyAccelerator` and the package's
  strategy (``AnyDDPStrategy``, ``AnyFSDPStrategy``, ``AnyModelParallelStrategy``,
  ``AnyDeepSpeedStrategy(stage=2)``);
- ``lightning``: a ``Trainer`` with Lightning's own accelerator for the device (the device table's
  ``lightning_builtin``) and Lightning's own strategy (``DDPStrategy``, ``FSDPStrategy``,
  ``ModelParallelStrategy``, ``DeepSpeedStrategy(stage=2)``): recorded as refused when Lightning
  refuses the device;
- ``raw``: a hand-written loop with the same parallel wrapper (``DistributedDataParallel``,
  ``FullyShardedDataParallel``, ``fully_shard``, ``deepspeed.initialize``) and no Lightning;
- ``raw+sigterm_broadcast`` (``ddp`` family): ``raw`` plus the one-element broadcast and host read
  Lightning 2.6's loop does before every step with several processes;
- ``single`` (``ddp`` family): rank 0 trains the unwrapped model alone while rank 1 waits, the
  1-process baseline for weak-scaling efficiency;
- family ``knobs`` (workload ``--knob-workload``): ``AnyDDPStrategy()`` (``plugin``) and
  ``plugin+<knob>``, ``AnyDDPStrategy`` with one DDP option of ``--knobs`` set.

The Trainers run in these externally started processes like under ``torchrun`` (``LOCAL_RANK``,
``RANK``, ``WORLD_SIZE`` set), so they reuse the process group instead of launching anything.
Rank 0 writes per-variant step times, CPU time and (in the first, untimed round) function calls
per step grouped by package, as JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

FAMILIES: tuple[str, ...] = ("ddp", "fsdp", "fsdp2", "deepspeed")
#: Every family the worker knows: the strategies, then the DDP options.
ALL_FAMILIES: tuple[str, ...] = (*FAMILIES, "knobs")
#: Options users set on DDP, measured as ``plugin+<name>`` variants of the ``knobs`` family.
KNOBS: dict[str, dict[str, Any]] = {
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "static_graph": {"static_graph": True},
    "bucket_cap_mb=100": {"bucket_cap_mb": 100},
    "bf16_compress_hook": {"ddp_comm_hook": "bf16"},
    "fp16_compress_hook": {"ddp_comm_hook": "fp16"},
}
#: Where a profiled function lives, for the per-step call breakdown (first match wins).
GROUPS: tuple[tuple[str, str], ...] = (
    ("lightning_anyaccel", "lightning_anyaccel"),
    ("benchmarks", os.sep + "benchmarks" + os.sep),
    ("lightning", os.sep + "lightning" + os.sep),
    ("deepspeed", os.sep + "deepspeed" + os.sep),
    ("torch.distributed", os.sep + "torch" + os.sep + "distributed" + os.sep),
    ("torch.nn.parallel", os.sep + "nn" + os.sep + "parallel" + os.sep),
    ("torch", os.sep + "torch" + os.sep),
)


def group_calls(profile: cProfile.Profile, steps: int) -> dict[str, dict[str, float]]:
    """Calls per step and profiled seconds per step of ``profile``, grouped by package (C calls: ``builtin``)."""
    out: dict[str, dict[str, Any]] = {}
    for (filename, line, name), (_cc, nc, tt, _ct, _callers) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        group = "builtin" if filename == "~" else next((g for g, key in GROUPS if key in filename), "other python")
        row = out.setdefault(group, {"calls": 0.0, "seconds": 0.0})
        row["calls"] += nc / steps
        row["seconds"] += tt / steps
        if group == "lightning_anyaccel":  # what the package itself runs per step, by name
            where = filename.split("lightning_anyaccel")[-1].lstrip("/\\")
            row.setdefault("functions", {})[f"{where}:{line} {name}"] = nc / steps
    result = dict(sorted(out.items(), key=lambda kv: -kv[1]["calls"]))
    # the functions with the most own time (profiled, so inflated; read them relative to each other)
    top = sorted(pstats.Stats(profile).stats.items(), key=lambda kv: -kv[1][2])[:8]  # type: ignore[attr-defined]
    result["_top_own_time"] = {f"{Path(k[0]).name}:{k[1]} {k[2]}": {"ms": 1e3 * v[2] / steps, "calls": v[1] / steps}
                               for k, v in top}
    return result


class StepClock:
    """Timestamps the end of every training step; times steps ``warmup .. warmup+measure-1``.

    The device is synchronised at the two ends of the timed window (no per-step syncs: the step
    times in between are host times, exact on CPU). With ``profile`` the timed window runs under
    ``cProfile`` instead (call counts, not timings).
    """

    def __init__(self, warmup: int, measure: int, device: Any, profile: bool = False) -> None:
        self.warmup, self.measure, self.device = warmup, measure, device
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.profile = cProfile.Profile() if profile else None

    def tick(self) -> None:
        from benchmarks.common import synchronize

        i = len(self.times)
        edge = i in (self.warmup - 1, self.warmup + self.measure - 1)
        if self.profile is not None and i == self.warmup + self.measure - 1:
            self.profile.disable()
        if edge:
            synchronize(self.device)
            self.cpu.append(time.process_time())
        self.times.append(time.perf_counter())
        if self.profile is not None and i == self.warmup - 1:
            self.profile.enable()

    def result(self) -> dict[str, Any]:
        """Steps/s (wall and CPU) of the timed window, and its per-step seconds."""
        end = self.warmup + self.measure
        if len(self.times) < end or len(self.cpu) < 2:
            raise RuntimeError(f"only {len(self.times)} of {end} steps ran")
        if self.profile is not None:
            return {"calls": group_calls(self.profile, self.measure)}
        window = self.times[self.warmup - 1 : end]
        return {
            "steps_per_s": self.measure / (window[-1] - window[0]),
            "cpu_steps_per_s": self.measure / max(self.cpu[1] - self.cpu[0], 1e-9),
            "step_s": [b - a for a, b in zip(window[:-1], window[1:])],
        }


def _callback(clock: StepClock) -> Any:
    from lightning.pytorch import Callback

    class _Tick(Callback):
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            clock.tick()

    return _Tick()


def _comm_hook(name: str | None) -> dict[str, Any]:
    """Lightning's ``ddp_comm_hook`` argument for a hook name (``None``: no hook)."""
    if name is None:
        return {}
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"ddp_comm_hook": {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}[name]}


def _ddp_options(knob: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(``DistributedDataParallel`` keyword arguments, comm hook or ``None``) of a knob."""
    options = dict(knob)
    hook = _comm_hook(options.pop("ddp_comm_hook", None)).get("ddp_comm_hook")
    return options, hook


class Runner:
    """Runs the variants of one rank; every method trains ``warmup + measure`` steps."""

    def __init__(self, args: argparse.Namespace) -> None:

        from benchmarks.models import WORKLOADS, scaled
        from lightning_anyaccel.device import runtime
        from lightning_anyaccel.device.devices import device_of, get_spec

        self.args = args
        self.rank, self.world = args.rank, args.world_size
        self.device_type = runtime.detect_device_type()
        self.device = device_of(self.device_type, self.rank)
        self.builtin = get_spec(self.device_type).lightning_builtin
        self.main_workload = scaled(WORKLOADS[args.workload], args.scale)
        self.knob_workload = scaled(WORKLOADS[args.knob_workload], args.knob_scale)
        self.workload = self.main_workload
        self.steps = args.warmup + args.measure
        self.classes: dict[str, str] = {}

    # ----- helpers ---------------------------------------------------------------------------

    def loader(self) -> Any:
        from benchmarks.models import make_loader

        return make_loader(self.workload, self.steps, seed=self.rank)  # weak scaling: own batches per rank

    def clock(self, profile: bool) -> StepClock:
        return StepClock(self.args.warmup, self.args.measure, self.device, profile and self.rank == 0)

    def seed(self) -> None:
        import torch

        torch.manual_seed(0)
        torch.set_num_threads(self.args.threads)

    def fit(self, name: str, accelerator: Any, strategy: Any, module: Any, clock: StepClock) -> None:
        """A Trainer fit in this process (the processes exist already: no launcher starts any)."""
        from lightning.pytorch import Trainer

        trainer = Trainer(
            accelerator=accelerator, strategy=strategy, devices=self.world, num_nodes=1, max_steps=self.steps,
            max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
            enable_model_summary=False, num_sanity_val_steps=0, callbacks=[_callback(clock)],
            use_distributed_sampler=False,
        )
        trainer.fit(module, self.loader())
        self.classes[name] = f"{type(trainer.accelerator).__name__}/{type(trainer.strategy).__name__}"

    def raw_loop(self, model: Any, optimizer: Any, clock: StepClock, step: Callable[[Any, Any], None] | None = None,
                 sigterm_broadcast: bool = False) -> None:
        """Forward, cross-entropy, backward, ``optimizer.step``, ``zero_grad(set_to_none=True)`` per batch.

        ``sigterm_broadcast`` adds what Lightning 2.6's training loop does before every step with more
        than one process (``_TrainingEpochLoop._broadcast_sigterm_tensor``): broadcast a one-element
        tensor from rank 0 and read it on the host.
        """
        import torch
        import torch.distributed as dist

        model.train()
        for x, y in self.loader():
            if sigterm_broadcast:
                flag = torch.tensor([0], device=self.device)
                dist.broadcast(flag, src=0)
                flag.item()
            x, y = x.to(self.device), y.to(self.device)
            if step is not None:
                step(x, y)
            else:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            clock.tick()

    def net(self) -> Any:
        from benchmarks.models import build_net

        self.seed()
        return build_net(self.workload).to(self.device)

    # ----- variants ----------------------------------------------------------------------------

    def variants(self, family: str) -> dict[str, Callable[[StepClock], None]]:
        from lightning_anyaccel import AnyAccelerator

        def any_acc() -> Any:
            return AnyAccelerator()

        out: dict[str, Callable[[StepClock], None]] = {}
        if family == "ddp":
            from lightning.pytorch.strategies import DDPStrategy

            from lightning_anyaccel import AnyDDPStrategy

            out["plugin"] = lambda c: self._fit_ddp("plugin", any_acc(), AnyDDPStrategy, {}, c)
            out["lightning"] = lambda c: self._fit_ddp("lightning", self.builtin, DDPStrategy, {}, c)
            out["raw"] = lambda c: self._raw_ddp({}, c)
            out["raw+sigterm_broadcast"] = lambda c: self._raw_ddp({}, c, sigterm_broadcast=True)
            out["single"] = self._single
        elif family == "knobs":
            from lightning_anyaccel import AnyDDPStrategy

            out["plugin"] = lambda c: self._fit_ddp("plugin", any_acc(), AnyDDPStrategy, {}, c)
            for knob in filter(None, self.args.knobs.split(",")):
                out[f"plugin+{knob}"] = (
                    lambda c, knob=knob: self._fit_ddp(f"plugin+{knob}", any_acc(), AnyDDPStrategy, KNOBS[knob], c)
                )
        elif family == "fsdp":
            from lightning.pytorch.strategies import FSDPStrategy

            from lightning_anyaccel import AnyFSDPStrategy

            out["plugin"] = lambda c: self._fit_plain("plugin", any_acc(), AnyFSDPStrategy(timeout=self.timeout), c)
            out["lightning"] = lambda c: self._fit_plain("lightning", self.builtin, FSDPStrategy(timeout=self.timeout), c)
            out["raw"] = self._raw_fsdp
        elif family == "fsdp2":
            from lightning.pytorch.strategies import ModelParallelStrategy

            from lightning_anyaccel import AnyModelParallelStrategy

            layout = {"data_parallel_size": self.world, "tensor_parallel_size": 1, "timeout": self.timeout}
            out["plugin"] = lambda c: self._fit_fsdp2("plugin", any_acc(), AnyModelParallelStrategy(**layout), c)
            out["lightning"] = lambda c: self._fit_fsdp2("lightning", self.builtin, ModelParallelStrategy(**layout), c)
            out["raw"] = self._raw_fsdp2
        elif family == "deepspeed":
            from lightning.pytorch.strategies import DeepSpeedStrategy

            from lightning_anyaccel import AnyDeepSpeedStrategy

            out["plugin"] = lambda c: self._fit_plain("plugin", any_acc(), AnyDeepSpeedStrategy(stage=2, timeout=self.timeout), c)
            out["lightning"] = lambda c: self._fit_plain(
                "lightning", self.builtin, DeepSpeedStrategy(stage=2, timeout=self.timeout), c)
            out["raw"] = self._raw_deepspeed
        else:
            raise ValueError(f"unknown strategy family {family!r}; choose from {', '.join(ALL_FAMILIES)}")
        if self.builtin is None:
            out.pop("lightning", None)
        if self.world == 1:  # no second process: nothing to scale against, and Lightning skips the broadcast
            out.pop("single", None)
            out.pop("raw+sigterm_broadcast", None)
        return out

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self.args.timeout)

    def _module(self) -> Any:
        from benchmarks.models import BenchModule

        self.seed()
        return BenchModule(self.workload)

    def _fit_plain(self, name: str, accelerator: Any, strategy: Any, clock: StepClock) -> None:
        self.fit(name, accelerator, strategy, self._module(), clock)

    def _fit_ddp(self, name: str, accelerator: Any, cls: type, knob: dict[str, Any], clock: StepClock) -> None:
        options = dict(knob)
        options.update(_comm_hook(options.pop("ddp_comm_hook", None)))
        self.fit(name, accelerator, cls(timeout=self.timeout, **options), self._module(), clock)

    def _fit_fsdp2(self, name: str, accelerator: Any, strategy: Any, clock: StepClock) -> None:
        from benchmarks.models import BenchModule

        class FSDP2Module(BenchModule):
            def configure_model(self) -> None:
                shard_mlp(self.net, self.device_mesh["data_parallel"])

        self.seed()
        self.fit(name, accelerator, strategy, FSDP2Module(self.workload), clock)

    def _raw_ddp(self, knob: dict[str, Any], clock: StepClock, sigterm_broadcast: bool = False) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        options, hook = _ddp_options(knob)
        ids = [self.device.index] if self.device.index is not None else None
        model = DistributedDataParallel(self.net(), device_ids=ids, **options)
        if hook is not None:
            model.register_comm_hook(None, hook)
        self.raw_loop(model, torch.optim.SGD(model.parameters(), lr=0.01), clock, sigterm_broadcast=sigterm_broadcast)
        name = "raw+sigterm_broadcast" if sigterm_broadcast else "raw"
        self.classes[name] = "torch.nn.parallel.DistributedDataParallel" + (
            " + Lightning's per-step broadcast" if sigterm_broadcast else "")

    def _single(self, clock: StepClock) -> None:
        """Rank 0 alone, no wrapper, no collectives; the other ranks wait at the next barrier."""
        import torch

        if self.rank == 0:
            model = self.net()
            self.raw_loop(model, torch.optim.SGD(model.parameters(), lr=0.01), clock)
        self.classes["single"] = "1 process, no wrapper"

    def _raw_fsdp(self, clock: StepClock) -> None:
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        # what Lightning's FSDPStrategy (and AnyFSDPStrategy) pass by default
        model = FullyShardedDataParallel(self.net(), sharding_strategy=ShardingStrategy.FULL_SHARD, cpu_offload=None,
                                         mixed_precision=None, device_id=self.device, use_orig_params=True)
        self.raw_loop(model, torch.optim.SGD(model.parameters(), lr=0.01), clock)
        self.classes["raw"] = "torch.distributed.fsdp.FullyShardedDataParallel"

    def _raw_fsdp2(self, clock: StepClock) -> None:
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        # the mesh ModelParallelStrategy builds: (data_parallel, tensor_parallel) = (world, 1)
        mesh = init_device_mesh(self.device_type, (self.world, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        model = self.net()
        shard_mlp(model, mesh["data_parallel"])
        self.raw_loop(model, torch.optim.SGD(model.parameters(), lr=0.01), clock)
        self.classes["raw"] = "torch.distributed.fsdp.fully_shard"

    def _raw_deepspeed(self, clock: StepClock) -> None:
        import deepspeed
        import torch

        model = self.net()
        engine, _, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.device.index if self.device.index is not None else self.rank),
            config=deepspeed_config(self.workload.batch), model=model, model_parameters=model.parameters(),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.01), dist_init_required=False,
        )

        def step(x: Any, y: Any) -> None:
            loss = torch.nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()

        self.raw_loop(engine, None, clock, step)
        self.classes["raw"] = "deepspeed.initialize (DeepSpeedEngine)"


def shard_mlp(net: Any, mesh: Any) -> None:
    """FSDP2: ``fully_shard`` every ``Linear`` of the MLP, then the MLP itself."""
    import torch
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)


def deepspeed_config(batch: int) -> dict[str, Any]:
    """DeepSpeed's config for the raw loop: Lightning's ``DeepSpeedStrategy(stage=2)`` defaults plus the batch.

    Lightning adds the micro-batch size, accumulation (1) and clipping (0) when it sets up; the
    raw loop sets the same three.
    """
    import copy

    from lightning.pytorch.strategies import DeepSpeedStrategy

    config = copy.deepcopy(DeepSpeedStrategy(stage=2).config)
    config.update(train_micro_batch_size_per_gpu=batch, gradient_accumulation_steps=1, gradient_clipping=0.0)
    return config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--families", default=",".join(ALL_FAMILIES))
    parser.add_argument("--workload", default="compute-bound")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--measure", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-measure", type=int, default=10, help="steps under cProfile in the first round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--knobs", default=",".join(KNOBS), help="comma-separated DDP options (KNOBS) for family knobs")
    parser.add_argument("--knob-workload", default="comm-bound")
    parser.add_argument("--knob-scale", type=float, default=1.0)
    parser.add_argument("--knob-measure", type=int, default=30)
    parser.add_argument("--knob-rounds", type=int, default=3)
    parser.add_argument("--variants", default="", help="comma-separated subset of the variants to run (default: all)")
    parser.add_argument("--dump-profiles", default="", help="folder for rank 0's cProfile files of the profiled round")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds any collective may wait")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.warmup < 1:
        parser.error("--warmup must be at least 1")

    # the Trainer's environment (as under torchrun): processes exist, nothing to launch
    os.environ.update(RANK=str(args.rank), LOCAL_RANK=str(args.rank), WORLD_SIZE=str(args.world_size), NODE_RANK="0")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    if "deepspeed" in families:
        from lightning_anyaccel.device import runtime
        from lightning_anyaccel.device.devices import get_spec
        from lightning_anyaccel.strategies.support import deepspeed_support

        name = runtime.detect_device_type()
        if deepspeed_support(get_spec(name), probe=False).supported:
            os.environ.setdefault("DS_ACCELERATOR", name)
        try:  # DeepSpeed's shared-memory CPU collective compiles for ~1 min; every variant uses gloo instead
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        except (ImportError, ValueError):  # ValueError: DeepSpeed has no accelerator for this device (below, per variant)
            pass

    import torch
    import torch.distributed as dist

    from benchmarks.common import quiet_bench
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.device.distributed import prepare_backend

    quiet_bench()
    runner = Runner(args)
    runtime.set_device_index(get_spec(runner.device.type), runner.device.index)
    dist.init_process_group(prepare_backend(runner.device), rank=args.rank, world_size=args.world_size,
                            timeout=timedelta(seconds=args.timeout),
                            device_id=runner.device if runner.device.index is not None else None)
    torch.set_num_threads(args.threads)
    doc: dict[str, Any] = {"backend": dist.get_backend(), "device": str(runner.device), "families": {}}
    for family in families:
        fam: dict[str, Any] = {"runs": {}, "calls_per_step": {}, "refused": {}, "errors": {}, "threads": {}}
        doc["families"][family] = fam
        try:
            variants = runner.variants(family)
        except Exception as err:  # e.g. deepspeed not installed: same on every rank
            fam["errors"]["*"] = f"{type(err).__name__}: {err}"
            continue
        if args.variants and family != "knobs":
            keep = {v.strip() for v in args.variants.split(",")}
            variants = {name: fn for name, fn in variants.items() if name in keep}
        runner.classes = {}
        knobs = family == "knobs"
        runner.workload = runner.knob_workload if knobs else runner.main_workload
        measure, rounds = (args.knob_measure, args.knob_rounds) if knobs else (args.measure, args.rounds)
        fam["settings"] = {"workload": runner.workload.name, "measured_steps": measure, "rounds": rounds}
        # round 0: untimed, profiled on rank 0 (first-use costs land here; deterministic call counts)
        for rnd in range(rounds + 1):
            for name in list(variants):
                profile = rnd == 0
                clock = StepClock(args.warmup, min(args.profile_measure, measure) if profile else measure,
                                  runner.device, profile and args.rank == 0)
                runner.steps = args.warmup + clock.measure
                dist.barrier()
                try:
                    variants[name](clock)
                except Exception as err:
                    message = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:400] if str(err).strip() else ''}"
                    if rnd == 0 and (name == "lightning" or name.startswith("plugin+")):
                        # Lightning's strategy does not run on this device, or torch refuses a DDP option
                        # on this backend (bf16 compression needs NCCL or XCCL)
                        fam["refused"][name] = message
                    else:
                        fam["errors"][name] = message + "\n" + traceback.format_exc()[-1500:]
                    del variants[name]
                    continue
                if args.rank != 0:
                    continue
                res = clock.result()
                if profile:
                    fam["calls_per_step"][name] = res["calls"]
                    if args.dump_profiles:  # for `python -m pstats` / snakeviz
                        Path(args.dump_profiles).mkdir(parents=True, exist_ok=True)
                        assert clock.profile is not None
                        clock.profile.dump_stats(str(Path(args.dump_profiles, f"{family}-{name}.prof")))
                else:
                    fam["runs"].setdefault(name, []).append(res)
                fam["threads"][name] = torch.get_num_threads()
        fam["classes"] = dict(runner.classes)
        fam["order"] = list(variants)
    dist.barrier()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(doc))


if __name__ == "__main__":
    main()
