r"""Run :mod:`~lightning_anyaccel.kit.tools.parity` for strategies: the serial reference, then each strategy on N processes.

One launch trains every run of ``--strategy`` (comma-separated) one after the other in the same processes, a
new Trainer each (for ``fabric_NAME``, a new Fabric and its loop:
:mod:`~lightning_anyaccel.kit.tools.parity_fabric`); rank 0 first computes the serial reference on its
device (:func:`reference_run`; last where a run forks: ``fork`` needs a parent that has not used the
device). A run is a strategy's short name, or ``NAME+CONTROL`` to break it on purpose (``ddp+sum_grads``: a
negative control of :data:`lightning_anyaccel.kit.tools.parity.CONTROLS`), ``@bf16`` at the end to train it
in bf16-mixed (``fsdp2@bf16``; ``--precision`` is the others'). Files::

    <out>/reference.pt              the serial run's steps (rank 0, before any strategy or after a fork)
    <out>/reference-bf16.pt         the serial bf16-mixed run, where a run is ``NAME@bf16``
    <out>/<run>/rank<N>.pt          what rank N saw, as full tensors

:func:`judge` compares them (:mod:`lightning_anyaccel.kit.tools.parity_compare`). The tests run it from
``tests/scripts/parity_run.py`` (popen DDP re-runs the script per rank); the validation kit's worker runs one
process of a check with :func:`rank`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from lightning_anyaccel.kit.tools import parity, parity_fabric
from lightning_anyaccel.kit.tools.parity_compare import ParityReport, compare, compare_bf16

if TYPE_CHECKING:
    from lightning_anyaccel.accelerator import AnyAccelerator

#: Short names of the strategies the parity check trains (``build_strategy``).
STRATEGIES = ("ddp", "ddp_find_unused", "ddp_spawn", "ddp_fork", "fsdp", "fsdp_grad_op", "fsdp_cpu_offload", "fsdp2",
              "model_parallel",
              "deepspeed_1", "deepspeed_2", "deepspeed_3", "deepspeed_1_offload", "deepspeed_2_offload",
              "deepspeed_3_offload")


#: Short names of Fabric's runs (:mod:`lightning_anyaccel.kit.tools.parity_fabric`): a plain Fabric loop.
FABRIC = parity_fabric.STRATEGIES


#: Every strategy name the package registers with each front end (``strategies.families.FAMILIES``): the
#: runs that check it (the Trainer's, then Fabric's), or, where none trains it, why it computes what a
#: checked run computes (or why it is not checked). ``tests/test_parity.py`` fails on a name missing here.
COVERAGE: dict[str, tuple[str, ...] | str] = {
    "any_single": "one process: nothing is reduced or sharded (what the serial reference computes)",
    "any_ddp": ("ddp", "fabric_ddp"),
    "any_ddp_find_unused_parameters_true": ("ddp_find_unused",),
    "any_ddp_spawn": ("ddp_spawn",),
    "any_ddp_spawn_find_unused_parameters_true": "the spawn start of ddp_spawn, the reducer of ddp_find_unused:"
                                                 " each checked, the start method does not reach the reducer",
    "any_ddp_fork": ("ddp_fork",),
    "any_ddp_fork_find_unused_parameters_true": "the fork start of ddp_fork, the reducer of ddp_find_unused:"
                                                " each checked, the start method does not reach the reducer",
    "any_ddp_notebook": "any_ddp_fork under another name: the same class and start method (fork)",
    "any_ddp_notebook_find_unused_parameters_true": "any_ddp_fork_find_unused_parameters_true under another name",
    "any_fsdp": ("fsdp", "fsdp_grad_op", "fabric_fsdp"),
    "any_fsdp_cpu_offload": ("fsdp_cpu_offload",),
    "any_fsdp2": ("fsdp2", "fabric_fsdp2"),
    "any_model_parallel": ("model_parallel", "fabric_model_parallel"),
    "any_deepspeed": "any_deepspeed_stage_2 under another name: Lightning's DeepSpeed defaults to stage 2",
    "any_deepspeed_stage_1": ("deepspeed_1", "fabric_deepspeed_1"),
    "any_deepspeed_stage_2": ("deepspeed_2", "fabric_deepspeed_2"),
    "any_deepspeed_stage_2_offload": ("deepspeed_2_offload", "fabric_deepspeed_2_offload"),
    "any_deepspeed_stage_3": ("deepspeed_3", "fabric_deepspeed_3"),
    "any_deepspeed_stage_3_offload": ("deepspeed_3_offload", "fabric_deepspeed_3_offload"),
}


def build_strategy(name: str) -> Any:
    """The package's Trainer strategy for a short ``name`` of :data:`STRATEGIES`."""
    import lightning_anyaccel

    anyaccel: Any = lightning_anyaccel  # the strategy classes are published from the device table at import

    if name == "ddp":
        return anyaccel.AnyDDPStrategy()
    if name == "ddp_find_unused":
        return anyaccel.AnyDDPStrategy(find_unused_parameters=True)
    if name in ("ddp_spawn", "ddp_fork"):
        return anyaccel.AnyDDPStrategy(start_method=name.removeprefix("ddp_"))
    if name.startswith("fsdp") and name != "fsdp2":  # use_orig_params: summon_full_params can gather the gradients
        return anyaccel.AnyFSDPStrategy(auto_wrap_policy={torch.nn.Linear}, use_orig_params=True,
                                        sharding_strategy="SHARD_GRAD_OP" if name == "fsdp_grad_op" else "FULL_SHARD",
                                        cpu_offload=name == "fsdp_cpu_offload")
    if name == "fsdp2":
        return anyaccel.AnyModelParallelStrategy(tensor_parallel_size=1)
    if name == "model_parallel":  # Lightning's defaults: tensor parallel across the node's processes
        return anyaccel.AnyModelParallelStrategy()
    if name.startswith("deepspeed_"):
        return parity.deepspeed_strategy(anyaccel.AnyDeepSpeedStrategy, name)
    raise ValueError(f"--strategy must be among {STRATEGIES}, not {name!r}")


def reference_run(device: torch.device | str, world_size: int, precision: str = "32-true") -> list[dict[str, Any]]:
    """The serial run of :mod:`~lightning_anyaccel.kit.tools.parity`: the whole global batch per step on one
    ``device``, plain torch."""
    device = torch.device(device)
    net = parity.build_net().to(device)
    trainable = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=parity.LR, momentum=0.9)
    batches = DataLoader(parity.dataset(world_size), batch_size=world_size * parity.PER_RANK_BATCH, shuffle=False)
    steps = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        before = {n: parity.host(p) for n, p in trainable}
        optimizer.zero_grad()
        with torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16-mixed"):
            out = net(x)
        torch.nn.functional.mse_loss(out.float(), y).backward()
        record = parity.StepRecord(grads={n: parity.host(p.grad) for n, p in trainable})
        record.norm_before = parity.global_norm(record.grads)
        torch.nn.utils.clip_grad_norm_([p for _, p in trainable], parity.CLIP)
        record.norm_after = parity.global_norm({n: parity.host(p.grad) for n, p in trainable})
        optimizer.step()
        record.update = {n: parity.host(p) - before[n] for n, p in trainable}
        record.frozen = {n: parity.host(p) for n, p in net.named_parameters() if not p.requires_grad}
        steps.append(record.as_dict())
    return steps


def fit(accelerator: AnyAccelerator, strategy: str, devices: int, num_nodes: int, precision: str, control: str,
        out: Path) -> tuple[Any, parity.ParityModule]:
    """Train one strategy ``parity.STEPS`` steps, each rank's steps to ``out/rank<N>.pt``; the Trainer, the model.

    With the ``spawn`` and ``fork`` start methods the ranks are this process's children: they write the
    files, and the model returned holds no steps.
    """
    from lightning.pytorch import Trainer

    model = parity.ParityModule(control, out)
    trainer = Trainer(accelerator=accelerator, strategy=build_strategy(strategy), devices=devices,
                      num_nodes=num_nodes, precision=precision,  # type: ignore[arg-type]  # a str of its literals
                      max_steps=parity.STEPS, gradient_clip_val=parity.CLIP, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0, use_distributed_sampler=False)
    trainer.fit(model)
    return trainer, model


def rank(accelerator: AnyAccelerator, strategy: str, devices: int, precision: str, control: str,
         out: Path) -> tuple[Any, parity.ParityModule]:
    """One process of a strategy's parity on ``devices`` processes (the validation kit's parity checks): the
    launching process first runs the serial reference on device 0 (:func:`reference`), then each rank trains
    ``strategy`` (:func:`fit`, into ``out/<strategy>``); the Trainer and the model, as :func:`fit` returns them."""
    if parity.launching():
        reference(accelerator.spec.device(0), devices, out, bf16=precision == "bf16-mixed")
    return fit(accelerator, strategy, devices, 1, precision, control, out / strategy)


def judge(out: Path, strategy: str, processes: int, precision: str = "32-true") -> ParityReport:
    """Compare every rank's steps of ``strategy`` with the reference under ``out``."""
    reference = torch.load(out / "reference.pt", weights_only=False)
    ranks = []
    for rank in range(processes):
        path = out / strategy / f"rank{rank}.pt"
        if not path.exists():
            raise parity.ParityError(f"{strategy}: rank {rank} wrote no results ({path})")
        ranks.append(torch.load(path, weights_only=False))
    if precision == "bf16-mixed":
        bf16 = torch.load(out / "reference-bf16.pt", weights_only=False)
        return compare_bf16(strategy, bf16, reference, ranks)
    return compare(strategy, reference, ranks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--strategy", default="ddp", help=f"comma-separated, of {', '.join(STRATEGIES + FABRIC)}")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--device-type", default=None)
    parser.add_argument("--precision", default="32-true", choices=("32-true", "bf16-mixed"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    runs = [(run, *run.partition("@")[0].partition("+")[::2],
             "bf16-mixed" if run.endswith("@bf16") else args.precision) for run in args.strategy.split(",")]
    if unknown := [run for run, name, control, _ in runs
                   if name not in STRATEGIES + FABRIC or (control or "none") not in parity.CONTROLS
                   or (name in FABRIC and control == "unsharded_param")]:
        parser.error(f"--strategy: {', '.join(unknown)}: each must be NAME[+CONTROL][@bf16], NAME among"
                     f" {', '.join(STRATEGIES + FABRIC)}, CONTROL among {', '.join(parity.CONTROLS)}"
                     " (unsharded_param: the Trainer's runs only)")
    from lightning_anyaccel.accelerator import AnyAccelerator
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.kit.tools.local_runs import quiet_lightning

    accelerator = AnyAccelerator(get_spec(args.device_type or runtime.detect_device_type()))
    quiet_lightning(all_warnings=True)
    torch.set_num_threads(1)
    out = Path(args.out)
    device, world_size = accelerator.spec.device(0), args.devices * args.num_nodes  # the serial runs' device
    bf16 = any(precision == "bf16-mixed" for *_, precision in runs)
    first = parity.launching()
    forks = any(name == "ddp_fork" for _, name, _, _ in runs)  # a fork needs a parent that has not used the device
    if first and not forks:  # the launching process, before it starts any rank
        reference(device, world_size, out, bf16)
    for run, name, control, precision in runs:
        if name in FABRIC:
            parity_fabric.fit(accelerator, name, args.devices, args.num_nodes, precision, out / run, control or "none")
        else:
            fit(accelerator, name, args.devices, args.num_nodes, precision, control or "none", out / run)
    if first and forks:
        reference(device, world_size, out, bf16)


def reference(device: torch.device, world_size: int, out: Path, bf16: bool = False) -> None:
    """The serial runs on ``device``: fp32 to ``out/reference.pt`` and, with ``bf16``, bf16-mixed to
    ``out/reference-bf16.pt`` (once: a reference already there is kept)."""
    if (out / "reference.pt").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    torch.save(reference_run(device, world_size), out / "reference.pt")
    if bf16:
        torch.save(reference_run(device, world_size, "bf16-mixed"), out / "reference-bf16.pt")
