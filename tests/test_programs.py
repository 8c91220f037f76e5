"""Lightning programs nobody edited for the package, put to work with ``LIGHTNING_ANYACCEL_ACTIVATE=1``.

Each runs as a user runs it, on the emulated accelerator (two ``hpu`` devices, ``lightning_anyaccel.kit.emulator``)
in fresh processes: the variable is the only change, and the start-up hook the package installs
(``lightning_anyaccel_startup.pth``) imports the package in every process once the program imports
Lightning, the processes Lightning's launcher starts included. Nothing is downloaded: the data and
LitGPT's checkpoint (a model built from a config, a tokenizer made from a word list) are made here.

- ``examples/cli_app.py``, a LightningCLI application, with its YAML config and command-line
  overrides and no accelerator: ``Trainer()`` trains DDP on both devices. Written for ``lightning``,
  and the same file with ``pytorch_lightning`` imports, whose config names the package's strategy
  by class path;
- LitGPT, a widely used Lightning application (in an environment of its own, ``make litgpt-env``: requirements/litgpt.in),
  through its own command line (``litgpt finetune_full ... --devices 2``): it builds Lightning's
  ``FSDPStrategy(...)`` itself, which trains on the device as the package's FSDP;
- the LightningCLI application again, its 2 ranks started by MPICH's ``mpiexec``, Open MPI's ``mpirun``,
  ``torchrun`` or SLURM's ``srun`` instead of Lightning: each rank is put to work by the variable it inherits.
"""

from __future__ import annotations

import os
import re
import site
import sys
from pathlib import Path

import pytest

from conftest import AUTOLOAD, DDP_TIMEOUT, LEAN_IMPORTS, ROOT, SRC, run_python
from lightning_anyaccel.kit.tools.local_runs import child_env

pytestmark = pytest.mark.slow

HOOK = "lightning_anyaccel_startup.pth"


def _program_env(emulate: str = "hpu:2", **extra: str) -> dict[str, str]:
    """The environment of a program on the emulated device, the package put to work by the variable alone."""
    hooks = [Path(p) / HOOK for p in site.getsitepackages() if (Path(p) / HOOK).exists()]
    if not hooks:
        pytest.fail(f"{HOOK} is not installed in {sys.prefix}: reinstall the package (`make install`)")
    env = child_env(loopback=True, LIGHTNING_ANYACCEL_EMULATE=emulate, LIGHTNING_ANYACCEL_ACTIVATE="1",
                    HF_HUB_OFFLINE="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(map(str, [AUTOLOAD, SRC, LEAN_IMPORTS]))
    return env


def _lines(out: str, prefix: str) -> list[str]:
    return sorted(line for line in out.splitlines() if line.startswith(prefix))


def documented_output(number: int) -> list[re.Pattern[str]]:
    """The lines of the ``number``-th ```text block of docs/programs.md (what the program prints), as patterns:
    numbers stand for any number, ``(...)`` for any text."""
    blocks = re.findall(r"```text\n(.*?)```", (ROOT / "docs" / "programs.md").read_text(), flags=re.S)
    patterns = []
    for line in blocks[number].splitlines():
        pattern = re.escape(line).replace(re.escape("(...)"), ".*")
        patterns.append(re.compile(re.sub(r"\d+\\.\d+", r"\\d+\\.\\d+", pattern)))
    return patterns


def assert_documented(out: str, number: int) -> None:
    """Every line the page shows for this program is in its output (the page's ```text block ``number``)."""
    for pattern in documented_output(number):
        assert any(pattern.fullmatch(line) for line in out.splitlines()), f"docs/programs.md: {pattern.pattern}"


#: The same application for ``pytorch_lightning``, with a config that names the package's DDP by class path.
PL_STRATEGY = """
trainer:
  strategy:
    class_path: lightning_anyaccel.pytorch_lightning.AnyDDPStrategy
    init_args:
      find_unused_parameters: false
"""


@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_a_lightning_cli_application_trains_on_the_device_without_an_accelerator_flag(package, tmp_path):
    """``cli_app.py fit --config cli_app.yaml`` + overrides: ``Trainer()`` finds 2 hpu devices and trains DDP on both."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (the programs extra)")
    app = ROOT / "examples" / "cli_app.py"
    configs = ["--config", str(ROOT / "examples" / "cli_app.yaml")]
    if package == "pytorch_lightning":
        app = tmp_path / "cli_app.py"
        app.write_text((ROOT / "examples" / "cli_app.py").read_text().replace("lightning.pytorch", "pytorch_lightning"))
        (tmp_path / "strategy.yaml").write_text(PL_STRATEGY)
        configs += ["--config", str(tmp_path / "strategy.yaml")]
    # the command of docs/programs.md (a YAML config, a command-line override)
    proc = run_python([str(app), "fit", *configs, "--trainer.max_epochs", "2"], env=_program_env(), cwd=tmp_path,
                      timeout=DDP_TIMEOUT)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert_documented(out, 0)
    assert "lightning-anyaccel: found 2 hpu devices (Intel Gaudi (HPU)): training with AnyDDPStrategy on 2 of them" \
        in out, out[-4000:]
    assert "distributed_backend=hccl" in out  # the device's collective backend, not gloo on the CPU
    ranks = _lines(out, "rank ")
    assert [line.split(":", 1)[0] for line in ranks] == ["rank 0 of 2", "rank 1 of 2"], out[-4000:]
    for line in ranks:  # Gaudi: each process sees its own card as hpu:0
        assert ": trained on hpu:0 with AnyDDPStrategy, loss " in line, line
        first, last = map(float, line.rsplit("loss ", 1)[1].split(" -> "))
        assert last < first / 4, line


VENV_BIN = Path(sys.executable).parent
#: launchers of the processes of one machine, as users start the application with them (``<app>`` stands for it)
LAUNCHERS = {
    "mpich": [str(VENV_BIN / "mpiexec"), "-n", "2", "-launcher", "fork", sys.executable, "<app>"],
    # Open MPI passes to other nodes only the variables named with -x (docs/programs.md)
    "openmpi": ["/usr/bin/mpirun", "--bind-to", "none", "--oversubscribe", "-n", "2", "-x",
                "LIGHTNING_ANYACCEL_ACTIVATE", sys.executable, "<app>"],
    "torchrun": [str(VENV_BIN / "torchrun"), "--nproc-per-node=2", "<app>"],
}
#: Open MPI refuses to start as root without the first two (CI runs as root); TCP between its processes
OMPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,tcp"}
#: launchers whose cell runs a code path other tests of ``make test`` run (docs/contributing.md, "Repeats"): the
#: variable in the processes an external launcher starts, and ``Trainer()`` choosing DDP on the devices under it, in
#: the Open MPI cell (the launcher that passes only the variables named with -x) and with srun; MPICH's and
#: torchrun's ranks, their environment inherited, train in tests/test_scaleout_launch.py, every rank checked
REPEATED_LAUNCHERS = {"mpich": "the openmpi cell, test_the_variable_reaches_every_task_srun_starts and"
                               " test_scaleout_launch.py::test_mpich_through_the_pbs_script",
                      "torchrun": "the openmpi cell, test_the_variable_reaches_every_task_srun_starts and"
                                  " test_scaleout_launch.py::test_torchrun_c10d"}
APP = [str(ROOT / "examples" / "cli_app.py"), "fit", "--config", str(ROOT / "examples" / "cli_app.yaml"),
       "--trainer.max_epochs", "2"]


def assert_every_rank_trained_on_its_acme_device(out: str) -> None:
    """``Trainer()`` found the 2 devices of a type in no table, and each rank trained on its own with DDP."""
    assert "lightning-anyaccel: found 2 acme devices" in out, out[-4000:]
    ranks = _lines(out, "rank ")
    assert [line.split(":", 1)[0] for line in ranks] == ["rank 0 of 2", "rank 1 of 2"], out[-4000:]
    for rank, line in enumerate(ranks):
        assert f": trained on acme:{rank} with AnyDDPStrategy, loss " in line, line


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_variable_reaches_every_rank_a_launcher_starts(launcher, tmp_path):
    """``mpiexec -n 2 python cli_app.py fit ...`` (MPICH, Open MPI), ``torchrun --nproc-per-node=2 cli_app.py fit
    ...``: the launcher, not Lightning, starts both ranks, and each is put to work by the variable it inherits."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (the programs extra)")
    from _cluster import Job
    from device_passes import skip_repeat
    from lightning_anyaccel.kit.tools.local_runs import free_port

    if launcher in REPEATED_LAUNCHERS:
        skip_repeat(REPEATED_LAUNCHERS[launcher])
    command = LAUNCHERS[launcher]
    if not Path(command[0]).exists():
        pytest.skip(f"{command[0]} is not installed (CI installs it: see .ci/run)")
    env = _program_env("acme:2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **OMPI_ENV)
    with Job(env=env) as job:
        app = command.index("<app>")
        job.spawn([*command[:app], *APP, "--trainer.default_root_dir", str(tmp_path)], tmp_path / "launcher.log")
        (result,) = job.wait(timeout=DDP_TIMEOUT)
    assert result.returncode == 0, result.output[-4000:]
    assert_every_rank_trained_on_its_acme_device(result.output)


def test_the_variable_reaches_every_task_srun_starts(tmp_path, monkeypatch):
    """``srun --ntasks-per-node=2 python cli_app.py fit ...`` on a private SLURM cluster: SLURM starts both tasks
    with the environment it exports (``--export=ALL``: the caller's), and each is put to work by the variable."""
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse (the programs extra)")
    from _cluster import missing, not_root, slurm_cluster
    from lightning_anyaccel.kit.tools.local_runs import free_port

    reason = not_root() or missing("slurmctld", "slurmd", "munged", "srun")
    if reason:
        pytest.skip(reason)
    env = _program_env("acme:2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    for name in ("LIGHTNING_ANYACCEL_ACTIVATE", "LIGHTNING_ANYACCEL_EMULATE", "PYTHONPATH", "MASTER_ADDR",
                 "MASTER_PORT", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, env[name])  # the caller's environment, which srun exports
    with slurm_cluster() as cluster:
        proc = cluster.run("srun", "-N", "1", "--ntasks-per-node=2", "--export=ALL", sys.executable, *APP,
                           "--trainer.default_root_dir", str(tmp_path), timeout=DDP_TIMEOUT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert_every_rank_trained_on_its_acme_device(proc.stdout + proc.stderr)


# ----- LitGPT ---------------------------------------------------------------------------------------------------


def _litgpt_python() -> Path:
    """The interpreter of LitGPT's own environment (``make litgpt-env``, requirements/litgpt.in): LitGPT caps
    huggingface-hub below what the main environment's transformers needs, so it is not installed there."""
    python = Path(os.environ.get("ANYACCEL_LITGPT_PYTHON") or ROOT / ".compat" / "litgpt" / "bin" / "python")
    if not python.exists():
        pytest.skip(f"LitGPT runs in an environment of its own, not built at {python}: `make litgpt-env`")
    if not list(python.parent.parent.glob(f"lib/python*/site-packages/{HOOK}")):
        pytest.fail(f"{HOOK} is not installed in {python.parent.parent}: rebuild it (`make litgpt-env`)")
    return python


def _litgpt_checkpoint(python: Path, root: Path) -> tuple[Path, Path]:
    """A tiny LitGPT checkpoint (config, random weights, a word-level tokenizer) and instruction data, made by
    tests/_litgpt_checkpoint.py in LitGPT's environment."""
    proc = run_python([str(Path(__file__).with_name("_litgpt_checkpoint.py")), str(root)], python=python,
                      env={"PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root / "tiny-llama", root / "data.json"


def test_litgpt_finetunes_on_the_device_through_its_own_command_line(tmp_path):
    """``litgpt finetune_full ... --devices 2``: LitGPT's own ``FSDPStrategy(...)`` trains on both hpu devices as the
    package's FSDP, in LitGPT's default precision (bf16-mixed where there is no CUDA), and saves its checkpoint."""
    python = _litgpt_python()
    checkpoint, data = _litgpt_checkpoint(python, tmp_path)
    litgpt = python.parent / "litgpt"
    out_dir = tmp_path / "out"
    args = ["finetune_full", str(checkpoint), "--out_dir", str(out_dir), "--devices", "2",
            "--data", "JSON", "--data.json_path", str(data), "--data.val_split_fraction", "0.25",
            "--data.num_workers", "0", "--train.global_batch_size", "4", "--train.micro_batch_size", "2",
            "--train.max_steps", "6", "--train.epochs", "10", "--train.lr_warmup_steps", "1",
            "--eval.interval", "1000", "--eval.initial_validation", "false", "--logger_name", "csv"]
    proc = run_python([str(litgpt), *args], env=_program_env(), cwd=tmp_path, timeout=DDP_TIMEOUT, python=python)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    assert "lightning-anyaccel: the program's FSDPStrategy(...) trains on 'hpu' as the package's AnyFSDPStrategy with" \
           " the same arguments (LIGHTNING_ANYACCEL_ACTIVATE=1)" in out, out[-4000:]
    assert "found 2 hpu devices (Intel Gaudi (HPU)): training with AnyFSDPStrategy on 2 of them" in out
    assert "distributed_backend=hccl" in out and "'precision': None" in out  # LitGPT chose its default precision
    losses = [float(line.split("loss train: ")[1].split(",")[0]) for line in out.splitlines() if "loss train:" in line]
    assert len(losses) == 6 and losses[-1] < losses[0], out[-4000:]
    assert "Final evaluation | val loss:" in out
    assert (out_dir / "final" / "lit_model.pth").is_file()
    assert_documented(out, 1)
