"""``python -m lightning_anyaccel.emulate``, the scan, the compile cache and the pytest plugin, as a user runs them.

The runs start the user's program as a user does (``python train.py``, ``torchrun``, ``mpirun``) under the command,
on CPU, and read the report it prints: each problem with the user's file and line first.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from conftest import ROOT, SRC, run_python

#: A small Lightning program written the CUDA way: a seed through torch.cuda (line 23), a mask built on
#: the CPU (line 14, used on line 15); ``devices`` from the command line.
CUDA_WAY = '''import sys
import torch
from torch import nn
import lightning as L


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        mask = torch.ones(x.shape[0], 1)
        logits = self.net(x) * mask
        return nn.functional.cross_entropy(logits, y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.cuda.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    L.Trainer(accelerator="auto", devices=int(sys.argv[1]), max_steps=3, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(Model(), loader)
'''
FIXED = CUDA_WAY.replace("torch.ones(x.shape[0], 1)", "torch.ones(x.shape[0], 1, device=x.device)").replace(
    "torch.cuda.manual_seed(0)", "torch.manual_seed(0)")


def _emulate(args: list[str], cwd: Path, timeout: float = 300) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    proc = run_python(["-m", "lightning_anyaccel.emulate", *args], env=env, cwd=cwd, timeout=timeout)
    return proc.returncode, proc.stdout


def test_import_of_the_package_loads_no_emulator_and_no_compiler() -> None:
    """``import lightning_anyaccel`` costs what it did: no emulator module, no ``torch.utils.cpp_extension``."""
    proc = run_python(["-X", "importtime", "-c", "import lightning_anyaccel"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stdout.splitlines() if line.startswith("import time:")}
    assert "lightning_anyaccel.accelerator" in imported  # the check reads the real import list
    assert not {m for m in imported if m.startswith(("lightning_anyaccel.emulat", "torch.utils.cpp_extension"))}


def test_the_scan_finds_each_cuda_only_construct_and_changes_nothing(tmp_path: Path) -> None:
    source = '''import torch as th
from torch import cuda
import torch.distributed as dist
from torch.utils.data import DataLoader
th.cuda.synchronize()
x = th.zeros(3).cuda()
y = th.ones(2, device="cuda:1")
th.backends.cudnn.benchmark = True
dist.init_process_group("nccl")
loader = DataLoader([], pin_memory=True, pin_memory_device="cuda")
n = cuda.device_count()
z = y.to("cuda")
trainer_args = dict(accelerator="gpu")
ok = th.ones(2, device=y.device)  # device-generic: not listed
'''
    script = tmp_path / "train.py"
    script.write_text(source)
    before = script.stat().st_mtime_ns
    code, out = _emulate(["--scan-only", str(tmp_path)], cwd=tmp_path, timeout=120)
    assert code == 1, out
    expected = {5: "torch.cuda.synchronize -> torch.accelerator.synchronize()", 6: ".cuda() -> .to(device)",
                7: "device='cuda:1' -> device=self.device", 8: "torch.backends.cudnn.benchmark -> Trainer(deterministic",
                9: '"nccl" -> torch.distributed.get_default_backend_for_device', 10: "pin_memory_device= -> pin_memory=True",
                11: "torch.cuda.device_count -> torch.accelerator.device_count()",
                12: "device 'cuda' -> the device in use", 13: "accelerator='gpu' -> accelerator=\"auto\""}
    for line, text in expected.items():
        assert f"train.py:{line}: {text}" in out, (line, out)
    assert "train.py:14:" not in out and "scan: 9 CUDA-only construct(s)" in out, out
    assert script.read_text() == source and script.stat().st_mtime_ns == before


@pytest.mark.slow
def test_a_run_reports_each_problem_with_the_users_line_in_every_ddp_rank(tmp_path: Path) -> None:
    """The CUDA-way program on two emulated xpu devices (DDP, two processes Lightning starts): the scan lists the
    torch.cuda seed, both ranks report the CPU mask at the user's line; fixed, the program is green."""
    (tmp_path / "train.py").write_text(CUDA_WAY)
    code, out = _emulate(["--as", "xpu", "--devices", "2", "--", sys.executable, "train.py", "2"], cwd=tmp_path)
    assert code != 0, out
    report = out.split("== emulated device report ==", 1)[1]
    assert "device: xpu (emulated)   processes: 2" in report and "optimizer steps: 0" in report, report
    assert f"{tmp_path / 'train.py'}:15: tensor on another device: Expected all tensors to be on the same device" in report
    assert "logits = self.net(x) * mask" in report and "fix: a tensor made without device=" in report
    assert f"{tmp_path / 'train.py'}:23: CUDA-only API: torch.cuda.manual_seed()" in report
    assert "train.py:23: torch.cuda.manual_seed -> torch.manual_seed(seed)" in out.split("== emulated", 1)[0]

    # fixed, it is green (on one device: the DDP start above is what two processes add)
    (tmp_path / "train.py").write_text(FIXED)
    code, out = _emulate(["--as", "xpu", "--devices", "1", "--", sys.executable, "train.py", "1"], cwd=tmp_path)
    assert code == 0, out
    assert "processes: 1" in out and "optimizer steps: 3 " in out and "problems: none" in out, out


TORCHRUN_PROGRAM = '''import os
import torch
import torch.distributed as dist

dist.init_process_group()  # the device's own backend: nothing names it
device = torch.device(torch.accelerator.current_accelerator().type, int(os.environ["LOCAL_RANK"]))
torch.accelerator.set_device_index(device.index)
if torch.cuda.is_available():
    print("never: CUDA is not there")
x = torch.full((4,), float(dist.get_rank() + 1), device=device)
work = dist.all_reduce(x, async_op=True)
print("RANK", dist.get_rank(), "ON", device, "READ", x.cpu().tolist(), flush=True)
big = torch.empty(96 << 20, dtype=torch.uint8, device=device)
'''


@pytest.mark.slow
def test_torchrun_ranks_have_the_device_and_report_cuda_calls_unwaited_collectives_and_out_of_memory(tmp_path):
    (tmp_path / "ranks.py").write_text(TORCHRUN_PROGRAM)
    code, out = _emulate(["--as", "npu", "--devices", "2", "--memory", "64MiB", "--no-scan", "--",
                          sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--standalone", "ranks.py"], cwd=tmp_path)
    assert code != 0, out
    assert "RANK 0 ON npu:0" in out and "RANK 1 ON npu:1" in out, out
    report = out.split("== emulated device report ==", 1)[1]
    path = tmp_path / "ranks.py"
    # torchrun's own process loads it too: three processes, the two ranks
    assert "device: npu (emulated)   processes: 3 (ranks 0, 1)" in report and "error:" not in report, report
    assert f"{path}:8: CUDA-only API: torch.cuda.is_available() called" in report, report
    assert f"{path}:11: collective not waited for" in report, report
    assert f"{path}:13: out of memory: out of memory allocating 96.00 MiB" in report, report


MPI_PROGRAM = """import os
import torch

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
x = torch.ones(2, device=f"npu:{rank}")
print(f"MPI RANK {rank} ON {x.device}", flush=True)
torch.cuda.is_available()
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed (CI installs it: see .ci/run)")
def test_mpirun_ranks_have_the_device_and_report_their_cuda_calls(tmp_path):
    """Ranks an MPI launcher starts (Open MPI's mpirun) inherit the device like Lightning's own ranks."""
    (tmp_path / "mpi_ranks.py").write_text(MPI_PROGRAM)
    code, out = _emulate(["--as", "npu", "--devices", "2", "--no-scan", "--", "mpirun", "--allow-run-as-root",
                          "--oversubscribe", "-n", "2", sys.executable, "mpi_ranks.py"], cwd=tmp_path)
    assert "MPI RANK 0 ON npu:0" in out and "MPI RANK 1 ON npu:1" in out, out
    report = out.split("== emulated device report ==", 1)[1]
    assert "processes: 2" in report, report
    assert f"{tmp_path / 'mpi_ranks.py'}:7: CUDA-only API: torch.cuda.is_available() called" in report, report
    assert code != 0, out


def test_no_compiler_is_one_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_anyaccel.emulator import build

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(build.CompilerMissingError) as raised:
        build.check_toolchain()
    message = str(raised.value)
    assert "no-such-compiler-here" in message and "build-essential python3-dev" in message
    assert "Linux only" in message
    monkeypatch.delenv("CXX")
    build.check_toolchain()  # this machine has both


def test_parallel_processes_compile_once_into_the_cache_the_variable_names(tmp_path, monkeypatch) -> None:
    """Two builds at once (xdist workers, DDP ranks): one compiles, the other waits and loads its library."""
    from torch.utils import cpp_extension

    from lightning_anyaccel.emulator import build

    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    compiles: list[str] = []

    def fake_compile(name: str, sources: list[str], build_directory: str, **kwargs: object) -> None:
        compiles.append(build_directory)
        threading.Event().wait(0.5)  # the second build arrives while this one compiles
        (Path(build_directory) / f"{name}.so").write_bytes(b"library")

    monkeypatch.setattr(cpp_extension, "load", fake_compile)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(build.build())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(compiles) == 1 and len(results) == 2 and results[0] == results[1]
    assert results[0].parent.parent == tmp_path / "cache" and results[0].read_bytes() == b"library"
    assert build.build() == results[0] and len(compiles) == 1  # a later use compiles nothing


def test_the_pytest_plugin_gives_a_users_suite_the_device(tmp_path: Path) -> None:
    """A project's own suite on CPU: one line in its conftest.py, a test that trains on ``emulated_device``."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["lightning_anyaccel.emulator.pytest_plugin"]\n')
    (tmp_path / "test_model.py").write_text('''import torch

def test_a_step_on_the_device(emulated_device):
    assert emulated_device.type == "mlu" and torch.accelerator.device_count() == 3
    model = torch.nn.Linear(4, 1).to(emulated_device)
    loss = model(torch.randn(8, 4, device=emulated_device)).pow(2).mean()
    loss.backward()
    assert model.weight.grad.device.type == emulated_device.type

def test_a_mask_on_the_cpu_fails(emulated_device):
    x = torch.randn(8, 4, device=emulated_device)
    try:
        x * torch.ones(8, 1)
    except RuntimeError as err:
        assert "same device" in str(err)
    else:
        raise AssertionError("the CPU mask went through")
''')
    env = {k: v for k, v in os.environ.items() if k not in ("LIGHTNING_ANYACCEL_EMULATE", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(SRC)
    proc = run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist",
                       "--emulate", "mlu:3", "test_model.py"], env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:]


def test_the_command_names_its_usage_without_a_program() -> None:
    proc = run_python(["-m", "lightning_anyaccel.emulate", "--as", "xpu"], cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "put the program's command after `--`" in proc.stdout, proc.stdout
