"""Build (once, cached) and import the emulator's C++ extension."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

EXTENSION = "lightning_anyaccel_emulator"
HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "csrc").glob("*.cpp"))


def build_dir() -> Path:
    """Where the compiled extension lives: one folder per torch and Python version."""
    tag = f"torch-{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}".replace("+", "_")
    return Path(os.environ.get("EMULATOR_BUILD_DIR", HERE / "_build")) / tag


def _library(directory: Path) -> Path:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[-1]  # ".so"
    return directory / f"{EXTENSION}{suffix}"


def _up_to_date(lib: Path) -> bool:
    return lib.exists() and all(lib.stat().st_mtime >= src.stat().st_mtime for src in SOURCES)


def build(verbose: bool = False) -> Path:
    """Compile the extension unless an up-to-date build exists; return the library path."""
    directory = build_dir()
    lib = _library(directory)
    if _up_to_date(lib):
        return lib
    from torch.utils import cpp_extension

    directory.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MAX_JOBS", "2")
    cpp_extension.load(
        name=EXTENSION,
        sources=[str(s) for s in SOURCES],
        build_directory=str(directory),
        extra_cflags=["-O1"],
        is_python_module=True,
        verbose=verbose,
    )
    found = [p for p in directory.iterdir() if p.name.startswith(EXTENSION) and p.suffix == ".so"]
    if not lib.exists() and found:
        return found[0]
    return lib


def import_extension() -> ModuleType:
    """The extension module, compiled first if needed (a file lock serialises concurrent builds)."""
    if EXTENSION in sys.modules:
        return sys.modules[EXTENSION]
    lib = build()
    spec = importlib.util.spec_from_file_location(EXTENSION, lib)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[EXTENSION] = module
    return module


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    path = build(verbose="-v" in sys.argv)
    print(f"emulator extension: {path} ({time.perf_counter() - start:.1f} s)")
