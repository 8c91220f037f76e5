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

from conftest import AUTOLOAD, LEAN_IMPORTS, ROOT, SRC, run_python

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
    """``python -m lightning_anyaccel.emulate ARGS`` as a user runs it: its exit status and output."""
    env = {k: v for k, v in os.environ.items() if k != "LIGHTNING_ANYACCEL_EMULATE"}
    proc = run_python(["-m", "lightning_anyaccel.emulate", *args], env=env, cwd=cwd, timeout=timeout)
    return proc.returncode, proc.stdout


def _emulate_here(args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                  timeout: float = 300) -> tuple[int, str]:
    """The command's ``main`` (all ``python -m lightning_anyaccel.emulate`` runs) in this process, in ``cwd``: its
    exit status and what it and the program's processes wrote (stderr first, the report last). No interpreter is
    started for the command itself (each would import Lightning, about 4 s of CPU); the program's processes are
    started as the command starts them. ``--timeout`` bounds the program: at it, its process group ends. The
    entry module's own runs: test_a_run_reports_each_problem_with_the_users_line_in_every_ddp_rank and
    test_the_command_names_its_usage_without_a_program."""
    from lightning_anyaccel.kit.emulate import main

    monkeypatch.delenv("LIGHTNING_ANYACCEL_EMULATE", raising=False)
    monkeypatch.chdir(cwd)
    capfd.readouterr()
    try:
        code = main(["--timeout", str(timeout), *args])
    except SystemExit as exited:  # argparse's error: exit status 2
        code = exited.code if isinstance(exited.code, int) else 1
    out, err = capfd.readouterr()
    return code, err + out


def test_import_of_the_package_loads_no_emulator_and_no_compiler() -> None:
    """``import lightning_anyaccel`` costs what it did: no emulator module, no ``torch.utils.cpp_extension``."""
    proc = run_python(["-X", "importtime", "-c", "import lightning_anyaccel"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stdout.splitlines() if line.startswith("import time:")}
    assert "lightning_anyaccel.accelerator" in imported  # the check reads the real import list
    assert not {m for m in imported if m.startswith(("lightning_anyaccel.emulat", "torch.utils.cpp_extension"))}


def test_the_scan_finds_each_cuda_only_construct_once_and_changes_nothing(tmp_path: Path, capfd, monkeypatch) -> None:
    source = '''import os
import torch as th
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
DEVICE = "cuda"
w = z.to(DEVICE)
name = os.environ.get("DEVICE", "cuda")
ok = th.ones(2, device=y.device)  # device-generic: not listed
def step(batch, device="cuda"):
    pass
'''
    script = tmp_path / "train.py"
    script.write_text(source)
    before = script.stat().st_mtime_ns
    code, out = _emulate_here(["--scan-only", str(tmp_path)], tmp_path, capfd, monkeypatch, timeout=120)
    assert code == 1, out
    in_use = 'th.accelerator.current_accelerator() or th.device("cpu")'
    expected = {6: "torch.cuda.synchronize -> th.get_device_module().synchronize()",
                7: f".cuda() -> th.zeros(3).to({in_use})", 8: f"device='cuda:1' -> ({in_use}).type",
                9: "torch.backends.cudnn.benchmark -> lightning.Trainer(benchmark=True)",
                10: f'"nccl" -> th.distributed.get_default_backend_for_device({in_use})',
                11: "pin_memory_device= -> pin_memory=True", 12: "torch.cuda.device_count -> th.accelerator.device_count()",
                13: f"device 'cuda' -> ({in_use}).type", 14: "accelerator='gpu' -> accelerator=\"auto\"",
                15: f"device 'cuda' in DEVICE -> ({in_use}).type", 17: "device 'cuda' as the default of os.environ.get",
                19: f"device 'cuda' as a parameter's default -> ({in_use}).type"}
    for line, text in expected.items():
        assert f"train.py:{line}: {text}" in out and out.count(f"train.py:{line}: ") == 1, (line, out)
    assert "DEVICE is used on line(s) 16: fixed here, fixed there" in out, out
    assert "train.py:16:" not in out and "train.py:18:" not in out and "scan: 12 CUDA-only construct(s)" in out, out
    assert script.read_text() == source and script.stat().st_mtime_ns == before


#: Executes each replacement the scan gives for the file it is handed, as the finding's form says.
RUN_REPLACEMENTS = '''import os, sys
from pathlib import Path
import lightning, torch
from lightning_anyaccel.kit.emulator.scan import scan

findings = scan([Path(sys.argv[1])])
names = {"torch": torch, "th": torch, "lightning": lightning, "os": os}
for finding in findings:
    text = f"dict({finding.replacement})" if finding.form == "keyword" else finding.replacement
    eval(compile(text, f"line {finding.line}", "exec" if finding.form == "statement" else "eval"), names)
print("ON", torch.accelerator.current_accelerator(), "RAN", len(findings), flush=True)
'''


def test_every_replacement_the_scan_suggests_runs_on_the_cpu_and_on_the_emulated_device(tmp_path: Path) -> None:
    """Each code the scan's table gives, as it prints it, runs on a machine without an accelerator and on one."""
    from lightning_anyaccel.kit.emulator.scan import CUDA_REPLACEMENTS

    arguments = {"set_device": "0", "manual_seed": "0", "manual_seed_all": "0", "stream": "None",
                 "autocast": "dtype=th.bfloat16"}
    calls = [f"th.cuda.{'amp.' if name in ('autocast', 'GradScaler') else ''}{name}({arguments.get(name, '')})"
             for name in CUDA_REPLACEMENTS]
    others = ["th.cuda.empty_cache()", "th.cuda.memory_allocated()", "th.cuda.get_device_name()", "th.zeros(2).cuda()",
              'th.ones(2, device="cuda:0")', 'DEVICE = "cuda"', 'os.environ.get("DEVICE", "cuda")',
              "th.backends.cudnn.benchmark = True", "th.backends.cudnn.deterministic = False", '"nccl"',
              'dict(pin_memory=True, pin_memory_device="cuda")', 'dict(accelerator="gpu")', 'def f(device="cuda"): pass']
    (tmp_path / "cuda_way.py").write_text("\n".join(["import os", "import torch as th", *calls, *others]) + "\n")
    (tmp_path / "run_replacements.py").write_text(RUN_REPLACEMENTS)
    expected = len(calls) + len(others)
    for emulate, on in (("", "None"), ("xpu:1", "xpu")):
        proc = run_python(["run_replacements.py", "cuda_way.py"], cwd=tmp_path, timeout=300, env={
            "LIGHTNING_ANYACCEL_EMULATE": emulate, "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), str(SRC), str(LEAN_IMPORTS)])})
        assert proc.returncode == 0 and f"ON {on} RAN {expected}" in proc.stdout, proc.stdout[-3000:]


def test_an_option_the_device_can_not_have_fails_before_the_program_runs(tmp_path: Path, capfd, monkeypatch) -> None:
    """Memory below the smallest device, a name torch keeps for itself, no devices: exit 2 naming the option, and the
    program never starts; a program in which no process had the device is no green run."""
    (tmp_path / "train.py").write_text("open('ran', 'w').write('ran')\n")
    for option, says in ((["--memory", "4KiB"], "--memory 4KiB: a device of 4096 bytes ('npu:1:memory=4KiB') is below"
                                                " the smallest the emulator makes, 2 MiB"),
                         (["--as", "cuda"], "--as cuda: 'cuda' is a device type torch builds in"),
                         (["--devices", "0"], "--devices 0: the device count '0'")):
        code, out = _emulate_here([*option, "--no-scan", "--", sys.executable, "train.py"], tmp_path, capfd, monkeypatch,
                                  timeout=120)
        assert code == 2 and says in out and not (tmp_path / "ran").exists(), out
    code, out = _emulate_here(["--no-scan", "--", sys.executable, "-I", "train.py"], tmp_path, capfd, monkeypatch)
    assert (tmp_path / "ran").exists() and code == 1, out  # -I: an interpreter that ignores PYTHONPATH
    assert "problems: not known: no process of the program had the emulated device" in out and "problems: none" not in out


@pytest.mark.slow
def test_a_run_reports_each_problem_with_the_users_line_in_every_ddp_rank(tmp_path: Path, capfd, monkeypatch) -> None:
    """The CUDA-way program on two emulated xpu devices (DDP, two processes Lightning starts): the scan lists the
    torch.cuda seed, both ranks report the CPU mask at the user's line; fixed, the program is green."""
    (tmp_path / "train.py").write_text(CUDA_WAY)
    code, out = _emulate(["--as", "xpu", "--devices", "2", "--", sys.executable, "train.py", "2"], cwd=tmp_path)
    assert code != 0, out
    report = out.split("== emulated device report ==", 1)[1]
    assert "device: xpu (emulated)   processes: 2" in report and "optimizer steps: 0" in report, report
    assert f"{tmp_path / 'train.py'}:15: tensor on another device: Expected all tensors to be on the same device" in report
    assert "logits = self.net(x) * mask" in report and "fix: a tensor made without device=" in report
    assert f"mask made on the CPU at {tmp_path / 'train.py'}:14: mask = torch.ones(x.shape[0], 1)" in report, report
    assert f"{tmp_path / 'train.py'}:23: CUDA-only API: torch.cuda.manual_seed()" in report
    assert "fix: torch.manual_seed(0) (runs on every device, and on a machine without one)" in report, report
    assert "train.py:23: torch.cuda.manual_seed -> torch.manual_seed(0)" in out.split("== emulated", 1)[0]

    # fixed, it is green (on one device: the DDP start above is what two processes add)
    (tmp_path / "train.py").write_text(FIXED)
    code, out = _emulate_here(["--as", "xpu", "--devices", "1", "--", sys.executable, "train.py", "1"], tmp_path, capfd,
                              monkeypatch)
    assert code == 0, out
    assert "processes: 1" in out and "optimizer steps: 3 " in out and "problems: none" in out, out


def test_a_failing_cuda_call_is_one_problem_with_its_own_fix_and_a_stray_tensor_names_its_line(tmp_path: Path) -> None:
    """``torch.cuda.synchronize()`` noted, then failing for want of CUDA at the same line: one problem, whose fix is the
    scan's code for that call; a same-device error points at the line that made the CPU tensor, or says it can not."""
    import torch

    from lightning_anyaccel.kit import emulate
    from lightning_anyaccel.kit.emulator import problems

    user = tmp_path / "user_code.py"
    user.write_text("import torch\n\ndef step(x):\n    torch.cuda.synchronize()\n    mask = torch.ones(2)\n"
                    "    return x * mask\n\ndef attribute_step(x, holder):\n    return x * holder.mask\n")
    frames = [(str(user), 4, "step")]
    saved = list(problems._state["problems"])
    try:
        problems._state["problems"].clear()
        problems.record("CUDA-only API", "torch.cuda.synchronize() called", frames, api="synchronize")
        problems.record("CUDA-only code", "AssertionError: Torch not compiled with CUDA enabled", frames)
        recorded = list(problems._state["problems"])
    finally:
        problems._state["problems"][:] = saved
    text, count = emulate.summarize([{"rank": None, "pid": 1, "steps": 0, "problems": recorded}], "npu", 1)
    assert count == 1 and "fix: torch.get_device_module().synchronize() (runs on every device" in text, text

    user.write_text(user.read_text().replace("    torch.cuda.synchronize()\n", "    pass\n"))  # CPU-only torch here
    sys.path.insert(0, str(tmp_path))
    try:
        import user_code
    finally:
        sys.path.remove(str(tmp_path))
    on_device = torch.ones(2, device="meta")  # a tensor on a device that is not the CPU, in this CPU process
    origins = []
    for call in (lambda: user_code.step(on_device),
                 lambda: user_code.attribute_step(on_device, type("Holder", (), {"mask": torch.ones(2)})())):
        with pytest.raises(RuntimeError) as raised:
            call()
        origins.append(problems.stray_tensor_origin(problems._innermost_user_frame(raised.value)))
    assert origins[0] == f"mask made on the CPU at {user}:5: mask = torch.ones(2)", origins
    assert origins[1].startswith("where the CPU tensor was made is not known: it is no local variable of"
                                 " attribute_step()"), origins


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
os.write(1, f"RANK {dist.get_rank()} ON {device} READ {x.cpu().tolist()}\\n".encode())  # one write: ranks share the pipe
big = torch.empty(96 << 20, dtype=torch.uint8, device=device)
'''


@pytest.mark.slow
def test_torchrun_ranks_have_the_device_and_report_cuda_calls_unwaited_collectives_and_out_of_memory(tmp_path, capfd,
                                                                                                      monkeypatch):
    (tmp_path / "ranks.py").write_text(TORCHRUN_PROGRAM)
    code, out = _emulate_here(["--as", "npu", "--devices", "2", "--memory", "64MiB", "--no-scan", "--",
                               sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--standalone", "ranks.py"], tmp_path, capfd, monkeypatch)
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
def test_mpirun_ranks_have_the_device_and_report_their_cuda_calls(tmp_path, capfd, monkeypatch):
    """Ranks an MPI launcher starts (Open MPI's mpirun) inherit the device like Lightning's own ranks."""
    (tmp_path / "mpi_ranks.py").write_text(MPI_PROGRAM)
    code, out = _emulate_here(["--as", "npu", "--devices", "2", "--no-scan", "--", "mpirun", "--allow-run-as-root",
                               "--oversubscribe", "-n", "2", sys.executable, "mpi_ranks.py"], tmp_path, capfd, monkeypatch)
    assert "MPI RANK 0 ON npu:0" in out and "MPI RANK 1 ON npu:1" in out, out
    report = out.split("== emulated device report ==", 1)[1]
    assert "processes: 2" in report, report
    assert f"{tmp_path / 'mpi_ranks.py'}:7: CUDA-only API: torch.cuda.is_available() called" in report, report
    assert code != 0, out


def test_no_compiler_is_one_error_naming_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_anyaccel.kit.emulator import build

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(build.CompilerMissingError) as raised:
        build.check_toolchain()
    message = str(raised.value)
    assert "no-such-compiler-here" in message and "build-essential python3-dev" in message
    assert "Linux only" in message
    monkeypatch.delenv("CXX")
    build.check_toolchain()  # this machine has both


def test_parallel_processes_compile_once_into_the_cache_the_variable_names(tmp_path, monkeypatch, capsys) -> None:
    """Two builds at once (xdist workers, DDP ranks): one compiles, saying so with its folder and time, the other
    says it waits for that compile, waits and loads its library."""
    import torch
    from torch.utils import cpp_extension

    from lightning_anyaccel.kit.emulator import build

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
    said = capsys.readouterr().err
    assert f"emulator: compiling the emulated device for torch {torch.__version__} into {results[0].parent}" in said
    assert said.count("emulator: compiled in ") == 1, said
    # the one that waited said whose compile it waits for, and for how long at most
    assert said.count(f"emulator: another process is compiling the emulated device into {results[0].parent};"
                      f" waiting for it (at most {build.LOCK_TIMEOUT_S:.0f} s)") == 1, said
    page = " ".join((Path(__file__).parents[1] / "docs" / "emulate.md").read_text().split())
    assert f"waiting for it (at most {build.LOCK_TIMEOUT_S:.0f} s)" in page  # what the user's page shows


#: A user's test file, as docs/emulate.md shows it: a LightningModule fit with ``accelerator=emulated_device.type``
#: on one device and on two (``STRATEGY``: Lightning's default, or ``ddp_spawn``); each process that fits writes
#: what it saw (its device, torch's accelerator, the device count and capacity) into ``RANKS_DIR``.
USER_TESTS = '''import os
{extra_import}import lightning as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset


class Model(BoringModel):
    def on_fit_start(self):
        seen = (self.device, torch.accelerator.current_accelerator(), torch.accelerator.device_count(),
                torch.get_device_module(self.device).mem_get_info()[1], self.trainer.num_devices)
        with open(os.path.join(os.environ["RANKS_DIR"], f"{{self.trainer.num_devices}}-{{self.global_rank}}"), "w") as f:
            f.write(" ".join(map(str, seen)))


def fit(device, tmp_path, devices, strategy="auto"):
    trainer = L.Trainer(accelerator=device.type, devices=devices, strategy=strategy, fast_dev_run=2,
                        default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), torch.utils.data.DataLoader(RandomDataset(32, 16), batch_size=4))
    assert trainer.strategy.root_device.type == device.type


def test_one_device(emulated_device, tmp_path):
    fit(emulated_device, tmp_path, 1)


def test_two_devices(emulated_device, tmp_path):
    fit(emulated_device, tmp_path, 2, os.environ["STRATEGY"])
'''


def _user_pytest(project: Path, args: list[str], timeout: float = 600, **env: str):
    """``pytest ARGS`` in a user's project outside the repository, its conftest.py holding the documented line."""
    (project / "conftest.py").write_text('pytest_plugins = ["lightning_anyaccel.kit.emulator.pytest_plugin"]\n')
    clean = {"LIGHTNING_ANYACCEL_EMULATE": "", "LIGHTNING_ANYACCEL_PYTEST_RESTARTED": "", "PYTEST_ADDOPTS": "",
             "LIGHTNING_ANYACCEL_EMULATE_REPORT": ""}
    return run_python(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", *args],
                      env={**clean, **env}, cwd=project, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "strategy", "extra_import", "rank_1_index"), [
    ("xpu:2:memory=2GiB", "ddp_spawn", "", 1),  # torch's own xpu, the page's own spec; spawned ranks
    # Lightning's default for two devices (ranks that run pytest again); every Gaudi process sees its card as hpu:0
    ("hpu", "auto", "import lightning_anyaccel\n", 0),
    ("npu", "auto", "", 1),  # a PrivateUse1 name, without importing the package in the test file
])
def test_the_pytest_plugin_fits_on_one_and_two_emulated_devices(tmp_path: Path, spec: str, strategy: str,
                                                                 extra_import: str, rank_1_index: int) -> None:
    """A user's project with the documented conftest.py line: a Lightning fit on one and on two emulated devices
    passes, every process that trained saw the device, its name and its capacity (never the CPU)."""
    project, ranks = tmp_path / "project", tmp_path / "ranks"
    project.mkdir()
    ranks.mkdir()
    (project / "test_model.py").write_text(USER_TESTS.format(extra_import=extra_import))
    proc = _user_pytest(project, ["--emulate", spec, "test_model.py"], RANKS_DIR=str(ranks), STRATEGY=strategy)
    assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-4000:]
    name = spec.split(":")[0]
    capacity = 2 << 30 if "memory=2GiB" in spec else 16 << 30
    seen = {path.name: path.read_text() for path in ranks.iterdir()}
    assert seen == {"1-0": f"{name}:0 {name} 2 {capacity} 1", "2-0": f"{name}:0 {name} 2 {capacity} 2",
                    "2-1": f"{name}:{rank_1_index} {name} 2 {capacity} 2"}, (seen, proc.stdout[-3000:])


def test_the_pytest_plugin_refuses_a_device_it_can_not_give(tmp_path: Path) -> None:
    """A spec it can not emulate ends pytest naming --emulate; a device that can not be built fails the test that
    asks for it, with the reason: nothing trains on the CPU in its place."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_model.py").write_text("def test_on_the_device(emulated_device):\n    raise AssertionError('ran')\n")
    # one bad spec: every one takes the same path (the emulator's check_spec, whose messages
    # test_an_option_the_device_can_not_have_fails_before_the_program_runs checks, then pytest's usage error)
    proc = _user_pytest(project, ["--emulate", "cuda", "test_model.py"], timeout=300)
    assert proc.returncode == 4 and "--emulate cuda: 'cuda' is a device type torch builds in" in proc.stdout, \
        proc.stdout[-3000:]
    proc = _user_pytest(project, ["--emulate", "npu", "test_model.py"], timeout=300, CXX="no-such-compiler-here",
                        LIGHTNING_ANYACCEL_EMULATOR_CACHE=str(tmp_path / "empty-cache"))
    assert proc.returncode == 1 and "1 error" in proc.stdout and "'ran'" not in proc.stdout, proc.stdout[-3000:]
    assert "--emulate npu: the emulated device could not be built: CompilerMissingError" in proc.stdout, proc.stdout[-3000:]


def test_the_command_names_its_usage_without_a_program() -> None:
    proc = run_python(["-m", "lightning_anyaccel.emulate", "--as", "xpu"], cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "put the program's command after `--`" in proc.stdout, proc.stdout
