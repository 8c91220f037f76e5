"""Parity: 2 processes of every multi-process strategy compute what one device computes (``kit/tools/parity.py``).

One 2-process launch per device under test (``--device``: CPU, and each emulated device of ``make test``)
trains, one after the other in the same processes, through the Trainer DDP (also with
``find_unused_parameters``), FSDP (full shard, SHARD_GRAD_OP, and CPU offload where the device is not
the host), FSDP2, tensor parallelism (``any_model_parallel``'s default: the 2 processes one tensor-parallel
group, the middle layers split) and, where DeepSpeed runs on the device type, ZeRO-1, ZeRO-2, ZeRO-3, each also with
optimizer offload (ZeRO-3: parameters too); then the same strategies through a plain Fabric loop
(``kit/tools/parity_fabric.py``). 3 steps each with gradient clipping, from the weights and rows of a serial
reference run on one device (rank 0, before the strategies). Then the negative controls, each of which
the comparison must reject, naming the tensor and the step: rank 1's gradient left out, gradients
summed instead of averaged, rank 1 skipping the update, and a trainable parameter outside every FSDP2
shard, two of them in the Fabric loop. DDP's ``spawn`` and ``fork`` start methods start their processes
from one parent: one more launch trains both (``test_ddp_start_methods_reproduce_one_device``; on the
emulated xpu and hpu the Makefile leaves them to ``acme``, as every spawn/fork test).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from conftest import run_python
from test_sharding_cpu import ENV, TIMEOUT, deepspeed_runs_on

RUN = str(Path(__file__).parent / "scripts" / "parity_run.py")


#: DeepSpeed's runs, each with the Trainer and with Fabric.
DEEPSPEED = ["deepspeed_1", "deepspeed_2", "deepspeed_3", "deepspeed_1_offload", "deepspeed_2_offload",
             "deepspeed_3_offload"]


def _strategies(device) -> list[str]:
    """The runs of the 2-process launch on the device under test: the Trainer's, then Fabric's."""
    from lightning_anyaccel.device.devices import is_host

    deepspeed = DEEPSPEED if deepspeed_runs_on(device.type) else []
    # CPU offload on CPU is refused up front (nothing to offload to: tests/test_sharding_errors.py)
    trainer = ["ddp", *([] if _unpinned(device) else ["ddp_find_unused"]), "fsdp", "fsdp_grad_op",
               *([] if is_host(device.type) else ["fsdp_cpu_offload"]), "fsdp2", "model_parallel", *deepspeed]
    return trainer + [f"fabric_{name}" for name in ["ddp", "fsdp", "fsdp2", "model_parallel", *deepspeed]]


def _unpinned(device) -> bool:
    """The emulated PrivateUse1 device, whose host memory torch never reports pinned: torch's DDP reducer asserts
    pinned memory for PrivateUse1 devices with ``find_unused_parameters`` (a vendor's PrivateUse1 device pins)."""
    from lightning_anyaccel.device.devices import privateuse1_name

    return device.emulated and device.type == privateuse1_name()


def _bf16(device_type: str) -> bool:
    from lightning_anyaccel.device.devices import get_spec

    return get_spec(device_type).supports_precision("bf16-mixed")


#: Each control, the strategy it breaks, and what the rejection must name (tensor and step).
CONTROLS = {
    "ddp+drop_rank_grad": r"rank 0, step 1: gradient of tensor \S+ differs",
    "ddp+sum_grads": r"rank 0, step 1: gradient of tensor \S+ differs",
    "ddp+skip_update": r"rank 1, step 1: update of tensor \S+ differs",
    "fsdp2+unsharded_param": r"rank 0, step 1: gradient of tensor 5\.gain differs",
    "fabric_ddp+skip_update": r"rank 1, step 1: update of tensor \S+ differs",
    "fabric_fsdp2+drop_rank_grad": r"rank 0, step 1: gradient of tensor \S+ differs",
}
#: bf16-mixed against the serial bf16-mixed run. FSDP1 is not among them: its MixedPrecision computes in
#: bf16 parameters rather than autocast, measured 2.97e-2 from the serial autocast run (above the tolerance).
BF16 = ["ddp@bf16", "fsdp2@bf16"]
STRATEGY_NAMES = ["ddp", "ddp_find_unused", "fsdp", "fsdp_grad_op", "fsdp_cpu_offload", "fsdp2", "model_parallel",
                  *DEEPSPEED, *(f"fabric_{name}" for name in ["ddp", "fsdp", "fsdp2", "model_parallel", *DEEPSPEED])]


def _run_job(out: Path, device_type: str, runs: Sequence[str], what: str) -> Path:
    """Run the parity script on ``runs`` into ``out``; a failed job fails the test with the end of its output."""
    proc = run_python([RUN, "--strategy", ",".join(runs), "--device-type", device_type, "--out", str(out)],
                      timeout=TIMEOUT, env=ENV)
    if proc.returncode != 0:
        lines = [line for line in proc.stdout.splitlines() if "Warning" not in line]
        pytest.fail(f"{what} exited with {proc.returncode}:\n" + "\n".join(lines[-80:]))
    return out


@pytest.fixture(scope="module")
def parity_job(tmp_path_factory, device) -> Path:
    """The one 2-process launch on the device under test: every strategy, then every negative control."""
    runs = [*_strategies(device), *(BF16 if _bf16(device.type) else []), *CONTROLS]
    return _run_job(tmp_path_factory.mktemp("parity"), device.type, runs, "the parity job")


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_two_processes_reproduce_one_device(parity_job, strategy, device):
    """Per step the global gradient norm before and after clipping, per tensor the gradient and the update
    of every rank within rtol 1e-5 / atol 1e-6 of the serial run; the frozen layer bit-identical. The same
    for Fabric's loop (``fabric_NAME``), and for DeepSpeed with optimizer offload, whose CPU optimizer steps
    on fp32 copies: measured at most 3.2e-7 on CPU and the emulated hpu."""
    if strategy not in _strategies(device):
        pytest.skip(f"FSDP's CPU offload is refused on {device.type}" if strategy == "fsdp_cpu_offload"
                    else f"the emulated {device.type} reports no pinned memory, which DDP's find_unused_parameters"
                         " needs on a PrivateUse1 device" if strategy == "ddp_find_unused"
                    else f"DeepSpeed does not run on {device.type} here")
    _judge_and_log(parity_job, strategy, device)


def _judge_and_log(out: Path, strategy: str, device) -> None:
    """Judge a run against the reference within the fp32 tolerance, and log its measured differences."""
    from lightning_anyaccel.kit.tools import parity
    from lightning_anyaccel.kit.tools.parity_run import judge

    report = judge(out, strategy, processes=2)
    assert report.steps == parity.STEPS
    assert max(report.norm, report.grad, report.update) <= parity.RTOL, report.line()
    measured = Path(os.environ.get("ANYACCEL_PARITY_LOG", out / "measured.jsonl"))
    with measured.open("a") as log:  # the measured differences, for docs/validate_hardware.md
        log.write(json.dumps({"device": device.type, **report.as_dict()}) + "\n")
    print(report.line())


@pytest.fixture(scope="module")
def start_methods_job(tmp_path_factory, device) -> Path:
    """One process on the device under test that trains DDP with ``spawn``, then with ``fork``: each starts 2 ranks."""
    return _run_job(tmp_path_factory.mktemp("parity-start-methods"), device.type, START_METHODS,
                    "the spawn/fork parity job")


#: DDP's start methods that start the ranks from one parent (the 2-process launch above is popen).
START_METHODS = ["ddp_spawn", "ddp_fork"]


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", START_METHODS)
def test_ddp_start_methods_reproduce_one_device(start_methods_job, strategy, device):
    """``any_ddp_spawn`` and ``any_ddp_fork``: the ranks the parent starts match the serial run on one device
    (computed by the parent after the fork: a fork needs a parent that has not used the device)."""
    _judge_and_log(start_methods_job, strategy, device)


def test_every_registered_strategy_is_checked_or_named():
    """Every name the package registers (each front end) is in ``parity_run.COVERAGE``: the runs that check it,
    each judged by a test above, or why its computation is a checked one; the aliases' claims hold."""
    import lightning_anyaccel
    from lightning_anyaccel.kit.tools.parity_run import COVERAGE
    from lightning_anyaccel.strategies.families import FAMILIES
    from lightning_anyaccel.strategies.families import START_METHODS as METHODS

    registered = {name for family in FAMILIES for name in family.names}
    missing = registered - set(COVERAGE)
    assert not missing, f"registered without parity coverage (add a run or a reason to COVERAGE): {missing}"
    assert not set(COVERAGE) - registered, f"no longer registered: {set(COVERAGE) - registered}"
    judged = set(STRATEGY_NAMES) | set(START_METHODS)  # each judged by a test above where it trains
    for name, runs in COVERAGE.items():
        if isinstance(runs, tuple):
            assert runs and set(runs) <= judged, (name, runs)
        else:
            assert len(runs) > 20, (name, runs)  # a reason in words
    assert METHODS["any_ddp_notebook"] == METHODS["any_ddp_fork"] == "fork"
    assert lightning_anyaccel.AnyDeepSpeedStrategy().config["zero_optimization"]["stage"] == 2  # any_deepspeed


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("run", BF16)
def test_bf16_mixed_matches_the_serial_bf16_run(parity_job, run, device):
    """bf16-mixed: each tensor within a relative 2-norm of 2e-2 of the serial bf16-mixed run, behind the validity
    gate (the serial bf16 run differs from the serial fp32 one: autocast computed in bf16 on the device)."""
    if not _bf16(device.type):
        pytest.skip(f"{device.type} does not autocast bf16")
    from lightning_anyaccel.kit.tools import parity
    from lightning_anyaccel.kit.tools.parity_run import judge

    report = judge(parity_job, run, processes=2, precision="bf16-mixed")
    assert max(report.norm, report.grad, report.update) <= parity.BF16_RTOL, report.line()
    print(report.line())


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("run", list(CONTROLS))
def test_negative_controls_are_rejected(parity_job, run):
    """Each broken run fails the comparison, and the failure names the rank, step and tensor (or the norm)."""
    from lightning_anyaccel.kit.tools.parity import ParityError
    from lightning_anyaccel.kit.tools.parity_run import judge

    with pytest.raises(ParityError, match=CONTROLS[run]) as rejected:
        judge(parity_job, run, processes=2)
    assert run in str(rejected.value)


GUARD = """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from lightning_anyaccel.strategies.errors import ShardingNotSupportedError
from lightning_anyaccel.strategies.model_parallel import refuse_unsharded_parameters
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
net[2].requires_grad_(False)  # frozen: nothing to average, allowed
fully_shard(net[0], mesh=mesh)
try:
    refuse_unsharded_parameters(net)
except ShardingNotSupportedError as err:
    print("REFUSED", err)
net.allow_unsharded_parameters = True
refuse_unsharded_parameters(net)  # the opt-out
del net.allow_unsharded_parameters
fully_shard(net, mesh=mesh)  # the root group takes the rest
refuse_unsharded_parameters(net)
print("ACCEPTED")
dist.destroy_process_group()
"""


def test_fsdp2_refuses_a_trainable_parameter_no_fully_shard_manages():
    """The FSDP2 guard (``strategies/model_parallel.py``), run by both front ends' setup before fitting:
    a trainable parameter outside every ``fully_shard`` is refused by name with the fix; frozen ones are not."""
    from lightning_anyaccel.kit.tools.local_runs import free_port

    proc = run_python(["-c", GUARD.format(port=free_port())], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    refused = next(line for line in proc.stdout.splitlines() if line.startswith("REFUSED"))
    assert "1.weight, 1.bias" in refused and "0.weight" not in refused and "2." not in refused, refused
    assert "never be averaged" in refused and "fully_shard" in refused and "ACCEPTED" in proc.stdout


#: What the 2-node run trains: a replicated and a sharded strategy, and ZeRO-3 where DeepSpeed is installed.
NODE_RUNS = ["ddp", "fsdp2", *(["deepspeed_3"] if deepspeed_runs_on("cpu") else [])]


@pytest.mark.slow
def test_two_nodes_of_two_processes_reproduce_one_device(tmp_path, device):
    """2 "nodes" x 2 processes on CPU, each node started by the environment-variable launch
    (``scripts/launch/env_vars.sh``, as tests/test_scaleout_launch.py): 4 ranks, each a quarter of the rows,
    reproduce the serial run within the fp32 tolerance, every rank's view of every tensor."""
    if not device.is_cpu:  # the emulated passes run the device-generic tests only
        pytest.skip("the 2-node run trains on CPU: the CPU pass runs it")
    from _cluster import LAUNCH, PYTHON, Job
    from lightning_anyaccel.kit.tools import parity
    from lightning_anyaccel.kit.tools.local_runs import free_port
    from lightning_anyaccel.kit.tools.parity_run import judge

    out = tmp_path / "out"
    with Job(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), **ENV}) as job:
        for node in (0, 1):
            job.spawn(["bash", str(LAUNCH / "env_vars.sh"), PYTHON, RUN, "--strategy", ",".join(NODE_RUNS),
                       "--devices", "2", "--num-nodes", "2", "--device-type", "cpu", "--out", str(out)],
                      tmp_path / f"node{node}.log", env={"NODE_RANK": str(node)})
        results = job.wait(timeout=TIMEOUT)
    assert [r.returncode for r in results] == [0, 0], "\n".join(r.output[-3000:] for r in results)
    for name in NODE_RUNS:
        report = judge(out, name, processes=4)
        assert max(report.norm, report.grad, report.update) <= parity.RTOL, report.line()
        print(report.line())
