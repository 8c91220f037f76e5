"""What a discrete accelerator enforces, on the device under test: operands on one device, a capacity.

Real devices refuse operands on another device, fail an allocation past their capacity with an
out-of-memory error and keep freed memory cached until ``empty_cache``. The emulated device
(``lightning_anyaccel.kit.emulator``) must be as strict, or an emulated pass proves less than it claims: these tests run
in every emulated pass (``pytest -m device_generic --device emulated:NAME``), and on hardware. On CPU,
which has neither a second device nor a capacity of its own, they are skipped. What only the emulated
device can show (a missing ``wait_stream``, a host read of device memory) is in ``tests/test_emulator.py``.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from lightning import Trainer

import lightning_anyaccel  # noqa: F401  (registers names)
from conftest import AUTOLOAD, TESTS, run_python
from lightning_anyaccel.device import runtime
from lightning_anyaccel.device.devices import get_spec
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader

MATCH = "Expected all tensors to be on the same device"


@pytest.fixture
def accelerator(device) -> torch.device:
    """Device 0 of the device under test (skips on CPU: nothing there is on another device)."""
    if device.is_cpu:
        pytest.skip("the CPU has no device of its own to keep operands on")
    return torch.device(device.type, 0)


#: Operations whose CPU operand a device refuses (the emulated device used to compute them on the host).
CPU_OPERANDS = {
    "matmul": lambda d: torch.ones(2, 2, device=d) @ torch.ones(2, 2),
    "linear": lambda d: F.linear(torch.ones(2, 3, device=d), torch.ones(4, 3)),
    "conv2d with CPU weights": lambda d: torch.nn.Conv2d(1, 1, 1)(torch.ones(1, 1, 2, 2, device=d)),
    "embedding of CPU indices": lambda d: F.embedding(torch.tensor([0, 1]), torch.ones(2, 2, device=d)),
    "cat": lambda d: torch.cat([torch.ones(2, device=d), torch.ones(2)]),
    "elementwise": lambda d: torch.ones(2, device=d) + torch.ones(2),
}


@pytest.mark.device_generic
@pytest.mark.parametrize("operation", list(CPU_OPERANDS))
def test_an_operand_on_the_cpu_is_refused(operation, accelerator):
    with pytest.raises(RuntimeError, match=MATCH):
        CPU_OPERANDS[operation](accelerator)


@pytest.mark.device_generic
@pytest.mark.needs_devices(2)
def test_an_operand_on_another_device_of_the_type_is_refused(accelerator):
    one, other = torch.ones(2, 2, device=accelerator), torch.ones(2, 2, device=torch.device(accelerator.type, 1))
    with pytest.raises(RuntimeError, match=MATCH):
        one @ other
    with pytest.raises(RuntimeError, match=MATCH):
        one + other


@pytest.mark.device_generic
def test_what_a_device_accepts_from_the_cpu(accelerator):
    """CPU scalars (0-dim tensors) in elementwise operations, CPU index tensors, and copies."""
    x = torch.arange(4.0, device=accelerator)
    assert (x * torch.tensor(2.0)).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert x[torch.tensor([3, 0])].cpu().tolist() == [3.0, 0.0]
    assert x[torch.tensor([True, False, True, False])].cpu().tolist() == [0.0, 2.0]
    x[torch.tensor([1])] = torch.tensor(9.0)
    y = torch.zeros(4, device=accelerator).copy_(torch.ones(4))
    assert x.cpu().tolist() == [0.0, 9.0, 2.0, 3.0] and y.to("cpu").tolist() == [1.0] * 4


class _HostTensorModel(DemoModel):
    """A model that leaves one tensor on the host: the device-generic bug every device refuses."""

    def __init__(self, mistake: str) -> None:
        super().__init__()
        self.mistake = mistake

    def on_fit_start(self) -> None:
        if self.mistake == "buffer registered after the move":
            self.register_buffer("scale", torch.eye(16))  # the model is on the device already

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mistake == "tensor made without device=":
            x = x @ torch.eye(16)
        elif self.mistake == "buffer registered after the move":
            x = x @ self.scale
        elif self.mistake == "layer made in forward":
            x = torch.nn.Linear(16, 16)(x)
        return self.net(x)


@pytest.mark.device_generic
@pytest.mark.parametrize("mistake", ["tensor made without device=", "buffer registered after the move",
                                     "layer made in forward"])
def test_a_tensor_left_on_the_cpu_fails_the_fit(mistake, accelerator):
    trainer = Trainer(accelerator="any", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match=MATCH):
        trainer.fit(_HostTensorModel(mistake), demo_loader())


def _capacity(device: torch.device) -> int:
    module = runtime.device_module(get_spec(device.type))
    if hasattr(module, "get_device_properties"):
        return int(module.get_device_properties(device.index).total_memory)
    return int(module.mem_get_info(device.index)[1])


@pytest.mark.device_generic
def test_an_allocation_past_the_capacity_is_out_of_memory(accelerator, device):
    """Whatever the device raises, the package recognises it as out of memory (what the batch-size finder asks)."""
    with pytest.raises(RuntimeError) as raised:
        torch.empty(_capacity(accelerator) + (1 << 30), dtype=torch.uint8, device=accelerator)
    assert runtime.is_out_of_memory(raised.value), raised.value
    if device.emulated:  # as CUDA's and XPU's allocators raise it
        assert isinstance(raised.value, torch.OutOfMemoryError)
        assert str(raised.value).startswith(f"{device.type.upper()} out of memory. Tried to allocate ")


@pytest.mark.device_generic
def test_freed_memory_stays_reserved_until_empty_cache(accelerator):
    def stat(name: str) -> int:
        return int(runtime.memory_stats(get_spec(accelerator.type), accelerator.index)[f"{name}.all.current"])

    size = 64 << 20
    runtime.empty_cache(get_spec(accelerator.type))
    allocated, reserved = stat("allocated_bytes"), stat("reserved_bytes")
    x = torch.empty(size, dtype=torch.uint8, device=accelerator)
    assert stat("allocated_bytes") >= allocated + size and stat("reserved_bytes") >= reserved + size
    del x
    assert stat("allocated_bytes") == allocated and stat("reserved_bytes") >= reserved + size  # cached
    runtime.empty_cache(get_spec(accelerator.type))
    assert stat("reserved_bytes") < reserved + size


def test_the_batch_size_finder_backs_off_on_a_device_out_of_memory(tmp_path):
    """Lightning's finder recognises only CUDA's out-of-memory messages; through the package it halves the
    batch size on any device's (here an emulated device of 96 MiB), with both Lightning packages."""
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    env.update(LIGHTNING_ANYACCEL_EMULATE="acme:1:memory=96MiB",
               PYTHONPATH=os.pathsep.join([str(AUTOLOAD), os.environ["PYTHONPATH"]]))  # the tests' src, lean imports
    proc = run_python([str(TESTS / "scripts" / "batch_size_finder.py")], env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = dict(line[len("RESULT "):].split(": ", 1) for line in proc.stdout.splitlines()
                   if line.startswith("RESULT "))
    for package in ("lightning", "pytorch_lightning"):
        assert results[f"{package} out of memory at"] != "never", proc.stdout[-4000:]
        found, failed = int(results[f"{package} batch size"]), int(results[f"{package} out of memory at"])
        assert 0 < found < failed, proc.stdout[-4000:]
        assert results[f"{package} fit"] == "done"
