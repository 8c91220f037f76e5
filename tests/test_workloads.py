"""Real workloads on the device under test: a Hugging Face GPT-2 and a CNN with BatchNorm.

One launch of ``examples/workloads.py`` (through ``tests/scripts/workload_run.py``) trains every
configuration — one device, DDP, FSDP with GPT-2 blocks auto-wrapped, FSDP2 with ``fully_shard``
per block, DeepSpeed ZeRO-2 where it runs, ``sync_batchnorm``, a compiled CNN, a checkpoint
resumed on CPU by one process — and writes what each rank saw; the tests below assert on it.
Each configuration must learn (the loss falls by the stated margin), train on the device under
test inside ``training_step``, clip as configured, and keep DDP ranks' weights equal.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, run_python

pytestmark = [
    pytest.mark.device_generic,
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                       reason="transformers is not installed (pip install lightning-anyaccel[workloads])"),
]

RUN = str(Path(__file__).parent / "scripts" / "workload_run.py")
ENV = {"ANYACCEL_DS_NO_SHM": "1", "TORCH_EXTENSIONS_DIR": str(ROOT / "build" / "torch_extensions")}
#: Bound for the whole job (about 100 s on 2 busy CPU cores).
TIMEOUT = 540
#: The configurations the job trains, comma-separated (``WORKLOAD_CONFIGS=gpt2_single``: GPT-2 through one
#: device only, what the Makefile's emulated xpu pass runs; empty: no job); unset: every one of
#: examples/workloads.py.
CONFIGS = os.environ.get("WORKLOAD_CONFIGS")


class Results(dict):
    """One rank's results: a test that reads a configuration the job did not train is skipped."""

    def __missing__(self, name: str) -> None:
        pytest.skip(f"{name} was not trained in this run (WORKLOAD_CONFIGS={CONFIGS})")


@pytest.fixture(scope="module")
def runs(device, tmp_path_factory) -> list[Results]:
    """Every rank's results of one job on the device under test.

    ``WORKLOAD_CONFIGS`` picks the configurations (all of them by default). On a machine with one device
    the job trains only the one-device configuration, and the tests of the 2-process ones
    (``needs_devices(2)``) are skipped, naming the count.
    """
    if CONFIGS == "":
        pytest.skip("no workload trains in this run (WORKLOAD_CONFIGS is empty)")
    out = tmp_path_factory.mktemp("workloads")
    wanted = CONFIGS if device.count >= 2 else "gpt2_single"
    configs = ["--configs", wanted] if wanted else []
    proc = run_python([RUN, "--device", device.type, "--out", str(out), *configs], timeout=TIMEOUT, env=ENV)
    lines = [line for line in proc.stdout.splitlines() if "Warning" not in line and "warn(" not in line]
    if proc.returncode != 0:
        pytest.fail(f"the workload job exited with {proc.returncode}:\n" + "\n".join(lines[-80:]))
    assert not [line for line in lines if "killed process" in line], "a successful job printed a kill:\n" + proc.stdout
    files = [out / f"rank{rank}.json" for rank in range(min(2, device.count))]
    return [Results(json.loads(file.read_text()) if file.exists() else {}) for file in files]


def _learned(run: dict, margin: float) -> None:
    """The mean of the last two losses is below the mean of the first two by ``margin`` (relative)."""
    first, last = sum(run["losses"][:2]) / 2, sum(run["losses"][-2:]) / 2
    assert last < first * (1 - margin), f"loss {first:.3f} -> {last:.3f}: less than {margin:.0%} lower"


GPT2 = ["gpt2_single", "gpt2_ddp", "gpt2_fsdp", "gpt2_fsdp2"]


#: The support matrix's features each GPT-2 configuration proves (tests/validation_record.py).
GPT2_FEATURES = {"gpt2_single": [pytest.mark.feature("transformer", "single_device")],
                 **{name: [pytest.mark.feature("transformer", name.removeprefix("gpt2_"), processes=2),
                           pytest.mark.needs_devices(2)] for name in ("gpt2_ddp", "gpt2_fsdp", "gpt2_fsdp2")}}


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=GPT2_FEATURES[name]) for name in GPT2])
def test_gpt2_learns_on_the_device(runs, device, name):
    """GPT-2 from its config (byte vocabulary) loses 15 % of its loss in 10 optimizer steps, on the device."""
    for rank, results in enumerate(runs):
        if rank == 1 and name == "gpt2_single":  # one device: rank 0 alone
            assert name not in results
            continue
        run = results[name]
        _learned(run, 0.15)
        assert run["devices"] == [device.type]
        assert run["global_step"] == 10


@pytest.mark.slow
def test_gradient_accumulation_scheduler_and_norm_clipping_on_one_device(runs):
    run = runs[0]["gpt2_single"]
    assert len(run["losses"]) == 2 * run["global_step"]  # accumulate_grad_batches=2
    assert max(run["grad_norms"]) > 1.0  # clipping had something to do
    assert max(run["clipped_norms"]) <= 1.0 + 1e-3
    assert run["lr_last"] == pytest.approx(3e-4)  # cosine decay to 10 % of 3e-3


@pytest.mark.slow
@pytest.mark.needs_devices(2)
def test_ddp_clips_by_value_syncs_the_metric_and_keeps_ranks_equal(runs):
    zero, one = runs[0]["gpt2_ddp"], runs[1]["gpt2_ddp"]
    assert zero["weights"] == one["weights"]
    assert max(zero["clipped_max_abs"]) <= 0.05 + 1e-6 < max(zero["grad_norms"])
    assert zero["losses"] != one["losses"]  # each rank saw its own data ...
    assert zero["synced_loss"] == pytest.approx(one["synced_loss"], rel=1e-6)  # ... the logged metric is synced


@pytest.mark.slow
@pytest.mark.needs_devices(2)
@pytest.mark.parametrize("name", ["gpt2_fsdp", "gpt2_fsdp2"])
def test_sharded_gpt2_clips_by_norm_over_all_shards(runs, name):
    """``gradient_clip_val=1.0`` under FSDP (Lightning refuses it) and FSDP2: the global norm is clipped."""
    for results in runs:
        run = results[name]
        assert max(run["grad_norms"]) > 1.0
        for before, after in zip(run["grad_norms"], run["clipped_norms"]):  # global norms, before and after
            assert after == pytest.approx(min(before, 1.0), rel=1e-3)
    assert runs[0]["gpt2_fsdp"]["fsdp_units"] == 3  # the root and its 2 GPT-2 blocks
    for results in runs:  # FSDP2: each rank holds about half of every parameter
        assert results["gpt2_fsdp2"]["dtensor_params"] > 0
        assert results["gpt2_fsdp2"]["local_fraction"] < 0.6


@pytest.mark.slow
@pytest.mark.needs_devices(2)
def test_sync_batchnorm_cnn_learns_with_synchronized_layers(runs, device):
    zero, one = runs[0]["cnn_syncbn"], runs[1]["cnn_syncbn"]
    for run in (zero, one):
        _learned(run, 0.15)
        assert run["devices"] == [device.type]
        assert set(run["batchnorm_layers"]) <= {"SyncBatchNorm", "DeviceSyncBatchNorm"}
        assert run["running_var_moved"] > 0.05  # running statistics were updated on the device
    assert zero["weights"] == one["weights"]  # weights and BatchNorm buffers


@pytest.mark.slow
@pytest.mark.needs_devices(2)
def test_device_sync_batchnorm_matches_batchnorm_on_the_full_batch(runs):
    """Outputs, input and parameter gradients, running statistics: as BatchNorm over both ranks' halves."""
    for results in runs:
        run = results["syncbn_numerics"]
        assert run["layer"] == "DeviceSyncBatchNorm"
        for key in ("output", "input_grad", "param_grads", "running_mean", "running_var"):
            assert run[key] < 1e-6, f"{key}: relative difference {run[key]}"


@pytest.mark.slow
@pytest.mark.needs_devices(2)
@pytest.mark.feature("transformer", "deepspeed", processes=2)
def test_deepspeed_trains_where_it_runs(runs, device):
    run = runs[0]["gpt2_deepspeed"]
    if "skipped" in run:
        pytest.skip(run["skipped"])
    _learned(run, 0.15)
    assert run["devices"] == [device.type]


@pytest.mark.slow
@pytest.mark.needs_devices(2)
@pytest.mark.feature("checkpoint", processes=2)
def test_checkpoint_resumes_on_cpu_with_one_process(runs):
    """The 2-process checkpoint of ``gpt2_ddp`` (on the device under test) resumes on CPU, world size 1."""
    run = runs[0]["resume"]
    assert run["resumed_from_step"] == 10 and run["global_step"] == 12
    assert run["devices"] == ["cpu"] and run["world_size"] == 1
    assert run["losses"][0] < runs[0]["gpt2_ddp"]["losses"][0] * 0.85  # it continued from the trained weights


def test_compile_refuses_inductor_up_front_where_it_has_no_code_generator(device):
    """Where Inductor cannot compile for the device, a compiled model fails before the first step, naming the fix."""
    import lightning as L
    import torch
    from lightning.pytorch.demos.boring_classes import BoringModel

    import lightning_anyaccel
    from lightning_anyaccel.device.compilation import CompileNotSupportedError, inductor_supports

    if inductor_supports(device.type):
        pytest.skip(f"Inductor compiles for {device.type!r}")

    class Compiled(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.compile(self.layer)  # Inductor, torch's default

    trainer = L.Trainer(accelerator=lightning_anyaccel.AnyAccelerator(device.type), devices=1, max_steps=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(CompileNotSupportedError, match="backend='aot_eager'"):
        trainer.fit(Compiled())
    assert trainer.global_step == 0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_causal_attention_matches_eager_on_the_device(device, backend, request):
    """``torch.compile`` with the backends known limitations says work everywhere, on an LLM's attention block
    (projections, heads, causal ``scaled_dot_product_attention``, as GPT-2's and LitGPT's): eager's loss and
    gradients. It failed with both backends on the emulated hpu and xpu (docs/emulator.md)."""
    import torch
    from torch import nn

    if device.is_cpu:
        pytest.skip("a device's check: on CPU these backends trace what torch itself runs")
    if device.emulated and device.type == "hpu" and backend == "aot_eager":
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "emulated hpu: torch compiles for HPU kernels that return contiguous results, the emulator's CPU kernels"
            " keep their input's layout, so a compiled view fails (docs/emulator.md)")))

    class CausalSelfAttention(nn.Module):
        def __init__(self, width: int = 32, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))

    torch.manual_seed(0)
    block = CausalSelfAttention().to(device.type)
    x = torch.randn(2, 8, 32, device=device.type)
    results = []
    for run in (block, torch.compile(block, backend=backend)):
        block.zero_grad()
        loss = run(x).pow(2).mean()
        loss.backward()
        results.append((loss.detach().cpu(), [p.grad.detach().cpu() for p in block.parameters()]))
    torch._dynamo.reset()
    torch.testing.assert_close(results[1][0], results[0][0])
    for compiled, eager in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


def test_compile_helper_picks_a_backend_that_compiles_for_the_device():
    import torch

    import lightning_anyaccel
    from lightning_anyaccel.device.compilation import CompileNotSupportedError, inductor_supports

    assert inductor_supports("cpu")
    assert not inductor_supports("no_such_device")
    with pytest.raises(CompileNotSupportedError, match="no code generator for 'no_such_device'"):
        lightning_anyaccel.compile(torch.nn.Linear(2, 2), device_type="no_such_device", backend="inductor")
    with pytest.raises(CompileNotSupportedError):
        lightning_anyaccel.compile(torch.nn.Linear(2, 2), device_type="no_such_device", fallback=False)
    compiled = lightning_anyaccel.compile(torch.nn.Linear(2, 2), device_type="no_such_device")  # aot_eager
    assert compiled(torch.ones(1, 2)).shape == (1, 2)
