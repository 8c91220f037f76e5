"""Sharded training for real on CPU: 2 processes, gloo, through the package's strategies, both front ends.

Each strategy trains the same wide MLP on the same data as DDP (``examples/shard_train.py``), through
the Trainer and through a Fabric loop: the per-rank losses must match DDP's, each rank must hold only
part of the parameters (FSDP, FSDP2, ZeRO-3) or of the optimizer state (ZeRO-1/2) and measure less
live memory than a DDP rank, and a checkpoint written after the first epoch must resume exactly like
DDP resumes (weights *and* optimizer state restored). Per front end, every strategy trains and
resumes in one 2-process job (a comma-separated ``--strategy``: a new model, Trainer or Fabric for
each, in the same processes), so the front end costs one launch of two interpreters; the job trains the
strategies whose cases the run selected (``make test`` leaves out the repeats of rule
``sharding-options-once`` in tests/device_passes.toml). What both front
ends decide without starting processes (names, precision, refusals) is tested in
``test_sharding_errors.py``.

On the device under test (``--device``, the emulated passes of ``make test``) one 2-process job trains
FSDP, FSDP2 and FSDP with CPU offload, and DeepSpeed ZeRO-1 and ZeRO-3 with offload where DeepSpeed runs
on that device type: parameters sharded on each rank's device, or offloaded to host memory. On CPU, and
on a machine with one device (``--device emulated:NAME:1``: the one-device pass of ``make test``), one
process trains each distributed strategy.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conftest import ROOT, device_under_test, rank_device, run_python, selected_params
from front_ends import FABRIC, FRONT_ENDS, TRAINER

RUN = str(Path(__file__).parent / "scripts" / "shard_run.py")
#: Wide enough that memory per rank shows the sharding (8.4 M parameters, 34 MB in fp32).
MODEL = ["--width", "1024", "--depth", "8"]
#: DeepSpeed's shared-memory CPU collectives compile for about a minute; gloo is enough here.
ENV = {"ANYACCEL_DS_NO_SHM": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / "build" / "torch_extensions")}
TIMEOUT = 420
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None

needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])",
)


def _ranks(out: Path) -> list[dict]:
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1]
    return ranks


def _launch(out: Path, strategies: str, *extra: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    proc = run_python([RUN, "--strategy", strategies, *MODEL, "--out", str(out), *extra], timeout=TIMEOUT, env=ENV)
    if proc.returncode != 0:  # DeepSpeed floods the log with deprecation warnings: show the rest
        lines = [line for line in proc.stdout.splitlines() if "Warning" not in line and "return func(" not in line]
        pytest.fail(f"{strategies} exited with {proc.returncode}:\n" + "\n".join(lines[-80:]))


# strategy, the package's class, is the checkpoint a folder (sharded), are parameters sharded (else:
# optimizer state only), the front ends that train it. A ``(replicas, shards)`` mesh is one Lightning
# would build on "cuda": training with it here, where there is no CUDA, shows the package built it on the
# device. The options of a strategy class that only change what its library is asked for (ZeRO-1,
# SHARD_GRAD_OP, offload) train through the Trainer; Fabric shares the strategy's code (the mixins) and
# trains each checkpoint format of its own save/load, DeepSpeed's as ZeRO-3 with offload. ZeRO-2 without offload
# trains in tests/test_journeys.py (the Aurora script under MPI). FSDP's CPU offload can not run where
# the model already is in host memory (the package refuses it on CPU: test_sharding_errors.py); it trains
# on the device under test below.
FORMATS = [
    pytest.param("fsdp", "AnyFSDPStrategy", False, True, ("trainer", "fabric"), id="fsdp-full"),
    pytest.param("fsdp_sharded", "AnyFSDPStrategy", True, True, ("trainer", "fabric"), id="fsdp-sharded"),
    pytest.param("fsdp_hybrid", "AnyFSDPStrategy", False, True, ("trainer", "fabric"), id="fsdp-hybrid-mesh"),
    pytest.param("fsdp_grad_op", "AnyFSDPStrategy", False, True, ("trainer",), id="fsdp-shard-grad-op"),
    pytest.param("fsdp2", "AnyModelParallelStrategy", True, True, ("trainer", "fabric"), id="fsdp2-distributed"),
    pytest.param("fsdp2_full", "AnyModelParallelStrategy", False, True, ("trainer", "fabric"), id="fsdp2-full"),
    pytest.param("deepspeed_1", "AnyDeepSpeedStrategy", True, False, ("trainer",), id="deepspeed1",
                 marks=needs_deepspeed),
    pytest.param("deepspeed_3", "AnyDeepSpeedStrategy", True, True, ("trainer",), id="deepspeed3",
                 marks=needs_deepspeed),
    pytest.param("deepspeed_2_offload", "AnyDeepSpeedStrategy", True, False, ("trainer",), id="deepspeed2-offload",
                 marks=needs_deepspeed),
    pytest.param("deepspeed_3_offload", "AnyDeepSpeedStrategy", True, True, ("trainer", "fabric"),
                 id="deepspeed3-offload", marks=needs_deepspeed),
]


def feature_of(strategy: str) -> str:
    """The support-matrix feature (tests/validation_record.py) a strategy of ``examples/shard_train.py`` shows."""
    return strategy.split("_")[0]


#: Per front end, the formats it trains (each test case is one format through one front end).
CASES = [pytest.param(front_end, *format_.values[:4], id=f"{front_end.name}-{format_.id}",
                      marks=[*format_.marks, pytest.mark.feature(feature_of(format_.values[0]), "checkpoint", processes=2)])
         for front_end in (TRAINER, FABRIC) for format_ in FORMATS if front_end.name in format_.values[4]]


def job_strategies(front_end: str, selected: set[str]) -> str:
    """``--strategy`` of a front end's job: DDP first, the reference every other strategy is compared with, then
    the strategies of :data:`FORMATS` among ``selected`` (those this run tests), in their order."""
    return ",".join(["ddp", *(p.values[0] for p in FORMATS if front_end in p.values[4] and p.values[0] in selected
                              and (HAS_DEEPSPEED or not p.marks))])


@pytest.fixture(scope="module")
def job(request, tmp_path_factory) -> Callable[[str], Path]:
    """``job(front_end)``: the folder of that front end's one 2-process job (every strategy this run tests with
    that front end, 3 steps and a checkpoint, then resumed to 6 steps), run on first use; a job that failed fails
    its other tests at once."""
    done: dict[str, Path | None] = {}

    def run(front_end: str) -> Path:
        if front_end not in done:
            done[front_end] = None
            root = tmp_path_factory.mktemp(front_end)
            wanted = {case["strategy"] for case in selected_params(request, "test_sharded_training_matches_ddp_and_resumes")
                      if case["front_end"].name == front_end}
            wanted |= {"fsdp2" for case in selected_params(request, "test_fsdp2_builds_its_mesh_on_the_device")
                       if case["front_end"].name == front_end}
            _launch(root / "out", job_strategies(front_end, wanted), "--front-end", front_end, "--max-steps", "3",
                    "--ckpt-dir", str(root / "ckpt"), "--resume-steps", "6")
            done[front_end] = root
        if (root := done[front_end]) is None:
            pytest.fail(f"the {front_end} job failed: see the first test of this front end")
        return root

    return run


def _assert_losses(got: list[dict], reference: list[dict]) -> None:
    for rank, expected in zip(got, reference):
        torch.testing.assert_close(rank["losses"], expected["losses"], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("front_end, strategy, class_name, folder, params_sharded", CASES)
def test_sharded_training_matches_ddp_and_resumes(job, front_end, strategy, class_name, folder, params_sharded):
    """Resuming is compared with DDP resumed the same way, not with an uninterrupted run: Lightning
    restarts the data at an epoch-end checkpoint differently than it continues a running fit."""
    root = job(front_end.name)
    ddp, ddp_resumed = _ranks(root / "out" / "ddp"), _ranks(root / "out" / "ddp" / "resumed")
    # the reference resumed trained weights: a fresh start (same seed) would repeat the first losses
    assert all(abs(r["losses"][0] - f["losses"][0]) > 1e-3 for r, f in zip(ddp_resumed, ddp)), (ddp_resumed, ddp)
    first, second = _ranks(root / "out" / strategy), _ranks(root / "out" / strategy / "resumed")
    cls = getattr(front_end.package, class_name)
    assert {r["strategy"] for r in first} == {f"{cls.__module__}.{cls.__name__}"}
    total = first[0]["total_numel"]
    assert ddp[0]["param_numel"] == total  # DDP: every rank holds everything
    assert ddp[0]["losses"] != ddp[1]["losses"]  # each rank saw its own half of the data
    held = [r["param_numel"] for r in first]
    if params_sharded:
        assert all(n < 0.6 * total for n in held), held
        assert sum(held) >= total, held  # the shards cover the model (DeepSpeed pads them)
    else:
        assert held == [total, total]  # ZeRO-1/2 keep full parameters
    states = [r["optimizer_state_numel"] for r in first]
    assert all(n < 0.6 * ddp[0]["optimizer_state_numel"] for n in states), states
    _assert_losses(first, ddp)
    # measured in each rank: live memory at step boundaries. Sharding only Adam's state (ZeRO-1/2) saves about a
    # quarter of DDP's (ZeRO-1 measured 0.69-0.76); sharding the parameters too about 60% (FSDP 0.40, ZeRO-3 0.54)
    bound = 0.8 if params_sharded else 0.9
    for rank, reference in zip(first, ddp):
        assert rank["peak_mib"] < bound * reference["peak_mib"], (rank, reference)

    last = root / "ckpt" / strategy / "last.ckpt"
    assert last.is_dir() is folder
    assert [r["global_step"] for r in second] == [6, 6]
    _assert_losses(second, ddp_resumed)  # as DDP resumed: weights and optimizer state restored

    if strategy.startswith("deepspeed"):  # DeepSpeed's folder -> one full fp32 file, loadable anywhere
        from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

        full = root / f"{strategy}-full.ckpt"
        convert_zero_checkpoint_to_fp32_state_dict(last, full)
        state = torch.load(full, map_location="cpu", weights_only=False)["state_dict"]
        assert sum(t.numel() for t in state.values()) == total


@pytest.mark.slow
@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_fsdp2_builds_its_mesh_on_the_device(job, front_end):
    """Lightning builds FSDP2's device mesh on "cuda"; the package builds it on the device trained on."""
    records = _ranks(job(front_end.name) / "out" / "fsdp2")
    assert {r["mesh_device_type"] for r in records} == {"cpu"}


def deepspeed_runs_on(device_type: str) -> bool:
    """Whether DeepSpeed trains on ``device_type`` here: the package's rule (DeepSpeed's own accelerator list
    and probe), which refuses the device up front otherwise."""
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.strategies.support import deepspeed_support

    return HAS_DEEPSPEED and deepspeed_support(get_spec(device_type)).supported


#: On the device under test: strategy -> (parameters and optimizer state on the rank's device, else in host
#: memory; parameters sharded, else optimizer state only). FSDP first: the others must train as it does.
DEVICE_FORMATS = {"fsdp": (True, True), "fsdp2": (True, True), "fsdp_offload": (False, True),
                  "deepspeed_1": (True, False), "deepspeed_3_offload": (False, True)}
DEVICE_STRATEGIES = [name for name in DEVICE_FORMATS
                     if not name.startswith("deepspeed") or deepspeed_runs_on(device_under_test().type)]


@pytest.fixture(scope="module")
def device_job(tmp_path_factory, device) -> Path:
    """One 2-process job on the device under test: every strategy of :data:`DEVICE_STRATEGIES`, 3 steps each."""
    if device.is_cpu:
        pytest.skip("on CPU, test_sharded_training_matches_ddp_and_resumes checks sharding in depth")
    out = tmp_path_factory.mktemp("device")
    _launch(out, ",".join(DEVICE_STRATEGIES), "--width", "256", "--depth", "4", "--max-steps", "3",
            "--device-type", device.type)
    return out


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("strategy", [pytest.param(name, marks=pytest.mark.feature(feature_of(name), processes=2))
                                      for name in DEVICE_STRATEGIES])
def test_parameters_sharded_on_the_device_under_test(device_job, strategy, device):
    """FSDP, FSDP2, FSDP with CPU offload and, where DeepSpeed runs, ZeRO-1 and ZeRO-3 with offload, with 2
    processes on the device under test (``--device``): each rank holds about half the parameters (ZeRO-1: half
    the optimizer state), as tensors on its own device or, offloaded, in host memory, and trains as FSDP does."""
    ranks, reference = _ranks(device_job / strategy), _ranks(device_job / "fsdp")
    on_device, params_sharded = DEVICE_FORMATS[strategy]
    total = ranks[0]["total_numel"]
    held = [r["param_numel"] for r in ranks]
    if params_sharded:
        assert all(n < 0.6 * total for n in held) and sum(held) >= total, held
    else:
        assert held == [total, total], held
    states = [r["optimizer_state_numel"] for r in ranks]
    assert all(n < 0.6 * 2 * total for n in states), states  # Adam's two moments, half of them per rank
    expected = [rank_device(device, 0), rank_device(device, 1)] if on_device else ["cpu", "cpu"]
    assert [r["param_device"] for r in ranks] == expected
    assert [r["optimizer_state_devices"] for r in ranks] == [[d] for d in expected]
    assert all(r["global_step"] == 3 and len(r["losses"]) == 3 for r in ranks)
    _assert_losses(ranks, reference)  # where the state lives changes nothing in the arithmetic


#: The distributed strategies a machine with one device trains as one process each (DeepSpeed where it runs).
ONE_PROCESS = ["ddp", "fsdp", "fsdp2", *(["deepspeed_2"] if deepspeed_runs_on(device_under_test().type) else [])]


@pytest.fixture(scope="module")
def one_process_job(tmp_path_factory, device) -> tuple[Path, str]:
    """One process on the device under test training every strategy of :data:`ONE_PROCESS`; its folder and log.

    CPU runs it in every pass (a machine without an accelerator trains with ``devices=1`` as one process).
    """
    if not device.is_cpu and device.count >= 2:
        pytest.skip(f"{device.count} {device.type} devices: the 2-process tests cover every strategy; the"
                    " one-device pass (--device emulated:NAME:1) runs this")
    out = tmp_path_factory.mktemp("one-process")
    proc = run_python([RUN, "--strategy", ",".join(ONE_PROCESS), "--devices", "1", "--device-type", device.type,
                       "--max-steps", "3", "--out", str(out)], timeout=TIMEOUT, env=ENV)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return out, proc.stdout


@pytest.mark.slow
@pytest.mark.device_generic
@pytest.mark.one_device
@pytest.mark.parametrize("strategy", [pytest.param(name, marks=pytest.mark.feature(feature_of(name), processes=1))
                                      for name in ONE_PROCESS])
def test_one_process_on_a_one_device_machine(one_process_job, strategy, device):
    """A machine with one device (one GPU): each distributed strategy trains as 1 process on it, with the
    device's collective backend and its parameters on the device. Machines with 2 or more devices run the
    2-process tests above instead."""
    out, log = one_process_job
    # Lightning's CUDA side stream around DDP made torch warn at every backward (Lightning-AI/pytorch-lightning#21567)
    assert "AccumulateGrad node's stream does not match" not in log
    (rank,) = [json.loads(p.read_text()) for p in sorted((out / strategy).glob("rank*.json"))]
    assert rank["global_step"] == 3 and len(rank["losses"]) == 3
    assert rank["backend"] == device.backend  # the device's collective backend, even for one process
    assert rank["param_device"] == ("cpu" if device.is_cpu else f"{device.type}:0")
    assert rank["param_numel"] == rank["total_numel"]  # one process holds everything
    assert all(v == v and v < 1e6 for v in rank["losses"])  # finite
