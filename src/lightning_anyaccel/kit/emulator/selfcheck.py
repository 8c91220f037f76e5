"""What the emulated device does, checked in one process: ``python -m lightning_anyaccel.kit.emulator.selfcheck NAME``.

Run by tests/test_emulator.py in a fresh interpreter (a process hosts one PrivateUse1 backend,
and the fork checks need a parent that has or has not initialised the device). Prints ``OK``.
"""

from __future__ import annotations

import copy
import io
import os
import sys

import torch


def main(name: str) -> None:
    from lightning_anyaccel.kit import emulator

    module = emulator.load(name)
    assert torch.accelerator.current_accelerator() == torch.device(name)
    assert torch.get_device_module(name) is module and module.device_count() == 2
    assert not module.is_initialized(), "counting devices must not initialise them"

    # fork before initialisation: the child may use the device
    pid = os.fork()
    if pid == 0:
        ok = not module._is_in_bad_fork() and float(torch.ones(2, device=name).sum()) == 2.0
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0, "a child forked before initialisation could not use the device"

    # memory: the allocator counts real allocations per device, peak and release included
    base = torch.accelerator.memory_allocated(0)
    x = torch.empty(1024, 1024, device=name)  # 4 MiB
    assert torch.accelerator.memory_allocated(0) - base == 4 << 20
    assert module.memory_allocated(0) == torch.accelerator.memory_allocated(0)
    assert module.memory_stats(0)["allocated_bytes.all.current"] == torch.accelerator.memory_allocated(0)
    del x
    assert torch.accelerator.memory_allocated(0) == base
    assert torch.accelerator.max_memory_allocated(0) >= base + (4 << 20)
    assert module.is_initialized()

    # device guard: the current index changes, tensors remember theirs, copies between indices
    with module.device(1):
        assert torch.accelerator.current_device_index() == 1
        y = torch.arange(4.0, device=name)
    assert torch.accelerator.current_device_index() == 0 and y.device == torch.device(name, 1)
    assert torch.accelerator.memory_allocated(1) > 0
    z = y.to(f"{name}:0") * 2
    assert z.device == torch.device(name, 0) and z.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]

    # compute through CPU kernels: a Linear forward/backward and optimizer steps (foreach, fused)
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    weight = lin.weight
    lin.to(name)
    assert lin.weight is weight, "Module.to() must keep the Parameter objects (optimizers hold them)"
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    data = torch.randn(16, 8)
    for model, dev in ((lin, name), (ref, "cpu")):
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=dev != "cpu")
        for _ in range(3):
            opt.zero_grad()
            model(data.to(dev)).pow(2).mean().backward()
            opt.step()
    assert lin.weight.device.type == name
    assert torch.allclose(lin.weight.cpu(), ref.weight, atol=1e-6), "device training differs from CPU"
    torch.optim.Adam(lin.parameters(), fused=True).step()
    state_matches_cpu(name)

    # a CNN: convolution forward/backward on the device equals CPU's
    conv = torch.nn.Conv2d(3, 4, 3)
    img = torch.randn(2, 3, 8, 8)
    out_dev = conv.to(name)(img.to(name))
    out_dev.sum().backward()
    grad_dev = conv.weight.grad.cpu()
    conv_cpu = conv.cpu()
    conv_cpu.weight.grad = None
    out_cpu = conv_cpu(img)
    out_cpu.sum().backward()
    assert torch.allclose(out_dev.cpu(), out_cpu, atol=1e-5) and torch.allclose(grad_dev, conv_cpu.weight.grad, atol=1e-4)

    # autocast dispatches for the device type; GradScaler runs its kernels on the device
    with torch.autocast(name, dtype=torch.bfloat16):
        assert lin(data.to(name)).dtype == torch.bfloat16
        assert torch.nn.functional.softmax(torch.ones(2, device=name, dtype=torch.bfloat16), 0).dtype == torch.float32
    assert lin(data.to(name)).dtype == torch.float32
    scaler = torch.amp.GradScaler(name, init_scale=2.0**4)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)
    with torch.autocast(name, dtype=torch.float16):
        loss = lin(data.to(name)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler._scale.device.type == name and scaler.get_scale() == 2.0**4
    lin.weight.grad.fill_(float("inf"))
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**3, "an inf gradient must halve the scale"

    # RNG: device generators seeded by manual_seed_all and by torch.manual_seed; independent of CPU's
    module.manual_seed_all(7)
    a = torch.rand(5, device=name)
    torch.rand(5)  # CPU draws do not move the device generator
    module.manual_seed_all(7)
    assert torch.equal(a.cpu(), torch.rand(5, device=name).cpu())
    if name != "hpu":  # torch.manual_seed seeds cuda, xpu, mps, mtia and PrivateUse1 devices, not hpu
        torch.manual_seed(7)
        assert torch.equal(a.cpu(), torch.rand(5, device=name).cpu())
    gen = torch.Generator(device=name).manual_seed(3)
    b = torch.randn(3, device=name, generator=gen)
    assert torch.equal(b.cpu(), torch.randn(3, device=name, generator=torch.Generator(device=name).manual_seed(3)).cpu())
    state = module.get_rng_state()
    c = torch.rand(3, device=name)
    module.set_rng_state(state)
    assert torch.equal(c.cpu(), torch.rand(3, device=name).cpu())
    module.synchronize()
    torch.accelerator.synchronize()

    # storage resize (what FSDP does to free and re-materialise parameters)
    s = torch.ones(10, device=name)
    s.untyped_storage().resize_(0)
    s.untyped_storage().resize_(40)
    assert s.untyped_storage().device.type == name

    # save/load keeps device tensors on the device
    buf = io.BytesIO()
    torch.save({"w": lin.weight}, buf)
    buf.seek(0)
    assert torch.load(buf)["w"].device == torch.device(name, 0)

    # fork after initialisation: the child sees the bad-fork state, as CUDA children do
    pid = os.fork()
    if pid == 0:
        bad = module._is_in_bad_fork()
        try:
            torch.ones(1, device=name)
            refused = False
        except RuntimeError as err:
            refused = "forked subprocess" in str(err)
        os._exit(0 if bad and refused else 1)
    assert os.waitpid(pid, 0)[1] == 0, "a child forked after initialisation was not in the bad-fork state"
    print("OK")


def state_matches_cpu(name: str) -> None:
    """What kernels change in place, on the device as on the CPU after a few steps: BatchNorm's
    running statistics (``native_batch_norm`` mutates them without its schema saying so), SGD's
    momentum buffers, Adam's ``exp_avg``/``exp_avg_sq`` (single-tensor and foreach), in-place ops."""
    torch.manual_seed(1)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(),
                                    torch.nn.Linear(5, 2))
    batches = [torch.randn(8, 6) for _ in range(3)]
    for optimizer, kwargs in ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                              (torch.optim.Adam, {"lr": 0.01, "foreach": False}),
                              (torch.optim.Adam, {"lr": 0.01, "foreach": True})):
        models = {}
        for dev in ("cpu", name):
            model = copy.deepcopy(cpu_model).to(dev)
            opt = optimizer(model.parameters(), **kwargs)
            for batch in batches:
                opt.zero_grad()
                model(batch.to(dev)).pow(2).mean().backward()
                opt.step()
            models[dev] = (model, opt)
        (ref, ref_opt), (got, got_opt) = models["cpu"], models[name]
        what = f"{optimizer.__name__}({kwargs})"
        for key, value in ref.state_dict().items():
            assert got.state_dict()[key].device.type == name, (what, key)
            assert torch.allclose(got.state_dict()[key].cpu().double(), value.double(), atol=1e-5), \
                f"{what}: {key} on the device differs from CPU"
        for ref_param, got_param in zip(ref.parameters(), got.parameters()):
            for key, value in ref_opt.state[ref_param].items():
                held = got_opt.state[got_param][key]
                assert torch.allclose(held.cpu().double(), value.double(), atol=1e-5), \
                    f"{what}: state {key!r} differs from CPU"
    assert float(models[name][0][1].running_mean.abs().sum()) > 0, "BatchNorm running_mean never updated"

    # in-place ops, views included: the device tensor itself changes, as on the CPU
    base = torch.randn(4, 5)
    results = {}
    for dev in ("cpu", name):
        t = base.clone().to(dev)  # .to("cpu") would return base itself
        t.add_(1).mul_(2).clamp_(-1, 3)
        t[1].fill_(0.5)
        t[:, 2].copy_(torch.arange(4.0, device=dev))
        t.index_add_(0, torch.tensor([0, 3], device=dev), torch.ones(2, 5, device=dev))
        t.masked_fill_(t > 2.5, -2.0)
        t.scatter_(1, torch.tensor([[0], [1], [2], [3]], device=dev), 9.0)
        view = t.view(20)
        view[::3] += 1
        torch.relu_(t)
        results[dev] = t
    assert torch.equal(results[name].cpu(), results["cpu"]), "in-place ops on the device differ from CPU"


def fit(name: str) -> None:
    """A bf16-mixed Lightning fit through the package's generic path on the emulated ``name``
    (``accelerator="xpu"``/``"hpu"`` by name, as the seeds' READMEs write it, else ``AnyAccelerator()``).

    A device type the package's table does not know needs no code either: the package derives its
    spec from torch (``lightning_anyaccel.device.devices.derive_spec``).
    """
    from lightning import Trainer

    from lightning_anyaccel import AnyAccelerator
    from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader
    model = DemoModel()
    # the seeds' README form for their devices: the accelerator by name (lightning-habana, the Aurora script)
    accelerator = name if name in ("xpu", "hpu") else AnyAccelerator()
    trainer = Trainer(accelerator=accelerator, devices=1, precision="bf16-mixed", max_steps=6, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, demo_loader())
    assert trainer.strategy.root_device == torch.device(name, 0), trainer.strategy.root_device
    assert model.autocast_seen == [(name, "bfloat16")] * 6, model.autocast_seen
    assert model.losses[-1] < model.losses[0]
    print("FIT OK")


if __name__ == "__main__":
    device_name = sys.argv[1] if len(sys.argv) > 1 else "npu"
    main(device_name)
    if "--fit" in sys.argv:
        fit(device_name)
