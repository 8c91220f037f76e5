"""Parity: 2 processes reproduce what one device computes, and the check rejects what must fail.

One 2-process job on the device under test (``--device``; CPU by default) trains DDP and FSDP2 for 3
optimizer steps each, in the same processes, from the same initial weights and rows as the serial
one-device reference rank 0 computes afterwards (``tests/scripts/parity_run.py``). Per step the global
gradient norm before and after clipping, per tensor the gradient and the update, and the frozen layer
(bit-identical) must match within the fp32 tolerance of ``lightning_anyaccel.tools.parity``. The negative
controls run in one more job, each with a fault installed, and assert that the check fails naming the step and tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_python
from lightning_anyaccel.tools.parity import ParityResult, compare

RUN = str(Path(__file__).parent / "scripts" / "parity_run.py")
TIMEOUT = 280
STRATEGIES = ("ddp", "fsdp2")


def _job(out: Path, strategies: str, device_type: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    proc = run_python([RUN, "--strategy", strategies, "--device-type", device_type, "--out", str(out)],
                      timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return out


def _judge(out: Path, entry: str) -> list[ParityResult]:
    ref = json.loads((out / "reference.json").read_text())
    results = []
    for rank in (0, 1):
        run = json.loads((out / f"{entry.replace(':', '-')}.rank{rank}.json").read_text())
        results.append(compare(ref["steps"], run["steps"], ref["frozen"], run["frozen"]))
    return results


@pytest.fixture(scope="module")
def parity_job(tmp_path_factory, device) -> Path:
    return _job(tmp_path_factory.mktemp("parity"), ",".join(STRATEGIES), device.type)


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_processes_match_one_device(parity_job, strategy):
    """Every rank's norms, gradients, updates and frozen weights match the serial reference in fp32."""
    for rank, result in enumerate(_judge(parity_job, strategy)):
        assert result.ok, f"{strategy} rank {rank}: {result.failure}"
        assert set(result.max_rel) == {"norm_before", "norm_after", "grads", "update"}


#: control, strategy, what the first failure must name.
CONTROLS = [
    ("drop_rank", "ddp", "step 0: grads of net.2.bias"),  # rank 1's gradient left out: rank 0's half remains
    ("sum", "ddp", "step 0: grads of net.2.bias"),  # summed instead of averaged: twice the gradient
    ("skip_update", "ddp", "step 0: update of net.2.bias"),  # rank 1 never moves its weights
    ("unsharded", "fsdp2", "step 0: grads of net.scale"),  # outside every shard: never averaged
]


@pytest.fixture(scope="module")
def controls_job(tmp_path_factory) -> Path:
    """Every control of :data:`CONTROLS`, one after the other in one 2-process job on CPU."""
    entries = ",".join(f"{strategy}:{control}" for control, strategy, _ in CONTROLS)
    return _job(tmp_path_factory.mktemp("controls"), entries, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize(("control", "strategy", "named"), CONTROLS, ids=[c[0] for c in CONTROLS])
def test_negative_controls_are_rejected(controls_job, control, strategy, named):
    """Each fault trains to the end, and the parity check rejects it, naming the step and the tensor."""
    failures = [r.failure for r in _judge(controls_job, f"{strategy}:{control}") if not r.ok]
    assert failures, f"the {control} control passed the parity check"
    assert any(f is not None and f.startswith(named) for f in failures), failures


@pytest.mark.slow
def test_fsdp2_refuses_a_parameter_outside_every_shard(tmp_path):
    """A trainable parameter no ``fully_shard`` manages is refused before fitting, by name, with the fix."""
    proc = run_python([RUN, "--strategy", "fsdp2:unsharded_guard", "--out", str(tmp_path)],
                      timeout=TIMEOUT)
    assert proc.returncode != 0
    assert "No fully_shard manages the trainable parameter(s) model.net.scale" in proc.stdout, proc.stdout[-3000:]
    assert "gradients would never be averaged across the 2 processes" in proc.stdout
    assert not list(tmp_path.glob("fsdp2*.rank*.json"))  # nothing trained
