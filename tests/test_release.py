"""Release artifacts: ``python -m build`` makes an sdist and a wheel that ``twine check`` passes, and the
wheel, installed into a fresh venv, registers its names with Lightning and trains; its start-up hook
(``LIGHTNING_ANYACCEL_ACTIVATE=1``) imports the package with Lightning and nothing without it.

The fresh venv (no ``--system-site-packages``) holds only the wheel in its own site-packages; the
dependencies (torch, Lightning) are read from this interpreter's site-packages through one path
line in a ``.pth`` file, which adds that folder but runs none of its ``.pth`` files, so an
editable install of this checkout stays invisible. No network, no source tree on ``sys.path``:
the child asserts both. Select with ``pytest -m release``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from lightning_anyaccel._version import __version__

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.release, pytest.mark.slow]

CHILD = r"""
import importlib.metadata, json, os, sys
from pathlib import Path
root = Path(sys.argv[1]).resolve()
leaks = [p for p in sys.path if p and Path(p).resolve() in (root, root / "src")]
import lightning
activated = "lightning_anyaccel" in sys.modules  # LIGHTNING_ANYACCEL_ACTIVATE=1: the start-up hook imported it
import lightning_anyaccel
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY as FABRIC_ACCELERATORS
from lightning_anyaccel.kit.tools.demo import DemoModel, demo_loader
import torch
torch.manual_seed(0)
model = DemoModel()
trainer = Trainer(accelerator="any", strategy="any_single", devices=1, max_steps=6, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, demo_loader())
# the validation kit, from the wheel alone: its command's entry, called here (not in a process of its own: this
# one has imported Lightning already); the check runs as `python -m lightning_anyaccel.validate --worker fit`
import contextlib, io
from lightning_anyaccel.validate import main as validate
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    validate_exit = validate(["--checks", "fit", "--record", sys.argv[2]])
print("RESULT " + json.dumps({
    "file": lightning_anyaccel.__file__,
    "version": lightning_anyaccel.__version__,
    "metadata_version": importlib.metadata.version("lightning-anyaccel"),
    "leaks": leaks,
    "accelerators": sorted(n for n in AcceleratorRegistry if n == "any" or n in lightning_anyaccel.DEVICE_TABLE),
    "strategies": sorted(n for n in StrategyRegistry if n.startswith("any_")),
    "fabric_accelerators": "any" in FABRIC_ACCELERATORS,
    "global_step": trainer.global_step,
    "strategy": type(trainer.strategy).__name__,
    "losses": [model.losses[0], model.losses[-1]],
    "activated": activated,
    "validate_exit": validate_exit,
    "validate_out": printed.getvalue(),
}))
"""
#: What a process that never imports Lightning has loaded, with LIGHTNING_ANYACCEL_ACTIVATE=1.
LAZY = "import sys; print(sorted(m for m in ('torch', 'lightning', 'lightning_anyaccel') if m in sys.modules))"


def _run(args: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build`` (sdist, then the wheel built from that sdist) with the installed setuptools."""
    for tool in ("build", "twine"):
        if subprocess.run([sys.executable, "-c", f"import {tool}"], check=False).returncode:
            pytest.fail(f"`{tool}` is not installed in {sys.executable}: run `make install` (it is in requirements/dev.lock)")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)], cwd=ROOT, timeout=300)
    return out


def _artifacts(dist: Path) -> tuple[Path, Path]:
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return wheel, sdist


def test_build_makes_an_sdist_and_a_wheel_named_by_the_one_version(dist):
    wheel, sdist = _artifacts(dist)
    assert wheel.name == f"lightning_anyaccel-{__version__}-py3-none-any.whl"
    assert sdist.name == f"lightning_anyaccel-{__version__}.tar.gz"


def test_twine_check_passes(dist):
    out = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())], cwd=dist, timeout=120)
    assert out.count("PASSED") == 2, out


def test_wheel_contents_and_metadata(dist):
    wheel, sdist = _artifacts(dist)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(meta_name).decode())
    assert "lightning_anyaccel/__init__.py" in names and "lightning_anyaccel/_version.py" in names
    assert "lightning_anyaccel/strategies/ddp.py" in names and "lightning_anyaccel/fabric/strategies.py" in names
    # the start-up hook at the root (site-packages): its .pth file and the module it arms
    assert {"lightning_anyaccel_startup.pth", "_lightning_anyaccel_startup.py", "_lightning_anyaccel_import_hook.py"} <= set(names)
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("lightning_anyaccel_startup.pth") == (ROOT / "src" / "lightning_anyaccel_startup.pth").read_bytes()
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "benchmarks/"))], "wheel ships non-package files"
    # the emulated device as source, compiled at first use (never at install: no library in the wheel)
    assert {"lightning_anyaccel/kit/emulator/csrc/emulator.cpp", "lightning_anyaccel/kit/emulator/autoload/sitecustomize.py",
            "lightning_anyaccel/emulate.py", "lightning_anyaccel/kit/emulate.py",
            "lightning_anyaccel/kit/emulator/build.py"} <= set(names)
    assert not [n for n in names if n.endswith((".so", ".o", ".pyd"))], "the wheel ships a compiled library"
    # what a downloaded notebook reads from the package: its recorded run time, notebook 4's launch scripts
    assert {"lightning_anyaccel/kit/tutorial/run_times.json", "lightning_anyaccel/kit/tutorial/launch/torchrun.sh",
            "lightning_anyaccel/kit/tutorial/launch/slurm.sbatch"} <= set(names)
    assert metadata["Version"] == __version__
    requires = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    core = {r.name: r for r in requires if r.marker is None}
    assert "torch" not in {r.name for r in requires}, "torch must not be a dependency (vendor builds)"
    for name in ("lightning", "pytorch-lightning"):
        assert name in core and not core[name].specifier.contains("2.6.2") and not core[name].specifier.contains("2.6.3")
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "setup.py", "README.md", "src/lightning_anyaccel/_version.py",
            "src/lightning_anyaccel_startup.pth", "src/lightning_anyaccel/kit/emulator/csrc/emulator.cpp",
            "src/lightning_anyaccel/kit/emulator/autoload/sitecustomize.py"} <= members


def test_wheel_in_a_fresh_venv_registers_and_trains(dist, tmp_path):
    wheel, _ = _artifacts(dist)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, timeout=120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path, timeout=60).strip())
    # the wheel, unpacked into the venv's own site-packages by the installer pip uses (no network)
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
         cwd=tmp_path, timeout=120)
    borrowed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_borrowed_dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(borrowed)))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",  # no PYTHONPATH
           "LIGHTNING_ANYACCEL_ACTIVATE": "1"}
    # the start-up hook costs a process that never imports Lightning nothing: no torch, no package
    assert _run([str(python), "-c", LAZY], cwd=tmp_path, timeout=60, env=env).strip() == "[]"
    record = tmp_path / "cpu-hardware.toml"
    out = _run([str(python), "-c", CHILD, str(ROOT), str(record)], cwd=tmp_path, timeout=480, env=env)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert Path(result["file"]).is_relative_to(venv), f"imported from {result['file']}, not the installed wheel"
    assert result["leaks"] == [], f"source tree on sys.path: {result['leaks']}"
    assert result["version"] == result["metadata_version"] == __version__
    assert "any" in result["accelerators"] and result["fabric_accelerators"]
    assert {"any_single", "any_ddp", "any_ddp_spawn", "any_fsdp", "any_deepspeed"} <= set(result["strategies"])
    assert result["global_step"] == 6 and result["strategy"] == "AnySingleDeviceStrategy"
    assert result["losses"][1] < result["losses"][0]
    assert result["activated"], "LIGHTNING_ANYACCEL_ACTIVATE=1 did not import the package with Lightning"
    # the validation kit, from the wheel alone: one check, its record written where asked
    out = result["validate_out"]
    assert result["validate_exit"] == 0 and "[ 1/1] fit: PASSED" in out and f"record written to {record}" in out, out
    from lightning_anyaccel.kit.tools import records

    assert records.problems(record.read_text()) == []
    written = records.loads(record.read_text())
    assert written["runner"] == "lightning_anyaccel.validate" and written["features"] == {"single_device": "passed"}
    assert written["lightning_anyaccel"] == __version__ and written["commit"] == "unknown"  # a wheel file: no commit
