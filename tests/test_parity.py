"""Parity: 2 processes of every multi-process strategy compute what one device computes (``tools/parity.py``).

One 2-process launch per device under test (``--device``: CPU, and each emulated device of ``make test``)
trains, one after the other in the same processes, DDP, FSDP (full shard and SHARD_GRAD_OP), FSDP2 and,
where DeepSpeed runs on the device type, ZeRO-1, ZeRO-2, ZeRO-3 and ZeRO-3 with offload, 3 steps each
with gradient clipping, from the weights and rows of a serial reference run on one device (rank 0,
before the strategies). Then the negative controls, each of which the comparison must reject, naming
the tensor and the step: rank 1's gradient left out, gradients summed instead of averaged, rank 1
skipping the update, and a trainable parameter outside every FSDP2 shard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_python
from test_sharding_cpu import ENV, TIMEOUT, deepspeed_runs_on

RUN = str(Path(__file__).parent / "scripts" / "parity_run.py")


def _strategies(device_type: str) -> list[str]:
    names = ["ddp", "fsdp", "fsdp_grad_op", "fsdp2"]
    if deepspeed_runs_on(device_type):
        names += ["deepspeed_1", "deepspeed_2", "deepspeed_3", "deepspeed_3_offload"]
    return names


def _bf16(device_type: str) -> bool:
    from lightning_anyaccel.device.devices import get_spec

    return get_spec(device_type).supports_precision("bf16-mixed")


#: Each control, the strategy it breaks, and what the rejection must name (tensor and step).
CONTROLS = {
    "ddp+drop_rank_grad": r"rank 0, step 1: gradient of tensor \S+ differs",
    "ddp+sum_grads": r"rank 0, step 1: gradient of tensor \S+ differs",
    "ddp+skip_update": r"rank 1, step 1: update of tensor \S+ differs",
    "fsdp2+unsharded_param": r"rank 0, step 1: gradient of tensor 5\.gain differs",
}
#: bf16-mixed against the serial bf16-mixed run. FSDP1 is not among them: its MixedPrecision computes in
#: bf16 parameters rather than autocast, measured 3e-2 from the serial autocast run (above the tolerance).
BF16 = ["ddp@bf16", "fsdp2@bf16"]
STRATEGY_NAMES = ["ddp", "fsdp", "fsdp_grad_op", "fsdp2", "deepspeed_1", "deepspeed_2", "deepspeed_3",
                  "deepspeed_3_offload"]


@pytest.fixture(scope="module")
def parity_job(tmp_path_factory, device) -> Path:
    """The one 2-process launch on the device under test: every strategy, then every negative control."""
    out = tmp_path_factory.mktemp("parity")
    runs = [*_strategies(device.type), *(BF16 if _bf16(device.type) else []), *CONTROLS]
    proc = run_python([RUN, "--strategy", ",".join(runs), "--device-type", device.type, "--out", str(out)],
                      timeout=TIMEOUT, env=ENV)
    if proc.returncode != 0:
        lines = [line for line in proc.stdout.splitlines() if "Warning" not in line]
        pytest.fail(f"the parity job exited with {proc.returncode}:\n" + "\n".join(lines[-80:]))
    return out


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_two_processes_reproduce_one_device(parity_job, strategy, device):
    """Per step the global gradient norm before and after clipping, per tensor the gradient and the update
    of every rank within rtol 1e-5 / atol 1e-6 of the serial run; the frozen layer bit-identical."""
    if strategy not in _strategies(device.type):
        pytest.skip(f"DeepSpeed does not run on {device.type} here")
    from lightning_anyaccel.tools import parity
    from lightning_anyaccel.tools.parity_run import judge

    report = judge(parity_job, strategy, processes=2)
    assert report.steps == parity.STEPS
    assert max(report.norm, report.grad, report.update) <= parity.RTOL, report.line()
    measured = Path(os.environ.get("ANYACCEL_PARITY_LOG", parity_job / "measured.jsonl"))
    with measured.open("a") as log:  # the measured differences, for docs/validate_hardware.md
        log.write(json.dumps({"device": device.type, **report.as_dict()}) + "\n")
    print(report.line())


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("run", BF16)
def test_bf16_mixed_matches_the_serial_bf16_run(parity_job, run, device):
    """bf16-mixed: each tensor within a relative 2-norm of 2e-2 of the serial bf16-mixed run, behind the validity
    gate (the serial bf16 run differs from the serial fp32 one: autocast computed in bf16 on the device)."""
    if not _bf16(device.type):
        pytest.skip(f"{device.type} does not autocast bf16")
    from lightning_anyaccel.tools import parity
    from lightning_anyaccel.tools.parity_run import judge

    report = judge(parity_job, run, processes=2, precision="bf16-mixed")
    assert max(report.norm, report.grad, report.update) <= parity.BF16_RTOL, report.line()
    print(report.line())


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("run", list(CONTROLS))
def test_negative_controls_are_rejected(parity_job, run):
    """Each broken run fails the comparison, and the failure names the rank, step and tensor (or the norm)."""
    from lightning_anyaccel.tools.parity import ParityError
    from lightning_anyaccel.tools.parity_run import judge

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
    from lightning_anyaccel.tools.local_runs import free_port

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
    from lightning_anyaccel.tools import parity
    from lightning_anyaccel.tools.local_runs import free_port
    from lightning_anyaccel.tools.parity_run import judge

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
