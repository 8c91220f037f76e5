"""Compile (once per torch version and source) and import the emulated device's C++ extension.

The library lives in a per-user cache, ``$XDG_CACHE_HOME/lightning_anyaccel/emulator/<tag>/``
(``~/.cache`` without ``XDG_CACHE_HOME``), where ``<tag>`` names the torch and Python versions and a
hash of the C++ source: a second use compiles nothing, a new torch compiles once more.
``LIGHTNING_ANYACCEL_EMULATOR_CACHE`` sets another folder (CI fills it once with
``python -m lightning_anyaccel.kit.emulator.build``). A file lock makes parallel processes (pytest-xdist
workers, DDP ranks) compile once: the others wait and load what the first built.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from types import ModuleType

import torch

EXTENSION = "lightning_anyaccel_emulator"
HERE = Path(__file__).resolve().parent
SOURCES = sorted((HERE / "csrc").glob("*.cpp"))
#: Sets the cache folder (the per-version folders go inside it).
CACHE_ENV = "LIGHTNING_ANYACCEL_EMULATOR_CACHE"
#: How long a process waits for another one's compile before it gives up (seconds).
LOCK_TIMEOUT_S = 900.0


class CompilerMissingError(RuntimeError):
    """No C++ compiler or no Python headers: the emulated device can not be compiled here."""


def source_hash() -> str:
    """A short hash of the C++ source: a changed source compiles into a new folder."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def cache_root() -> Path:
    """The folder that holds one compiled build per torch version and source."""
    override = os.environ.get(CACHE_ENV, "").strip()
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base) / "lightning_anyaccel" / "emulator"


def build_dir() -> Path:
    """This torch's, this Python's and this source's build folder."""
    tag = f"torch-{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}-{source_hash()}"
    return cache_root() / tag.replace("+", "_")


def _library(directory: Path) -> Path:
    return directory / f"{EXTENSION}{importlib.machinery.EXTENSION_SUFFIXES[-1]}"


def check_toolchain() -> None:
    """Raise :class:`CompilerMissingError`, naming what to install, where a compile can not work."""
    compiler = os.environ.get("CXX", "c++").split()[0]
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    missing = [what for what, ok in (("a C++ compiler (" + compiler + ")", shutil.which(compiler) is not None),
                                     (f"the Python headers ({header})", header.is_file())) if not ok]
    if missing:
        raise CompilerMissingError(
            f"The emulated device is compiled from C++ at its first use, and this machine lacks {' and '.join(missing)}."
            " On Debian/Ubuntu: `sudo apt-get install build-essential python3-dev`; on Fedora/RHEL:"
            " `sudo dnf install gcc-c++ python3-devel`; in conda: `conda install gxx_linux-64`."
            " The emulated device is supported on Linux only.")


def build(verbose: bool = False) -> Path:
    """Compile the extension unless this version's build exists; return the library path."""
    directory = build_dir()
    lib, done = _library(directory), directory / "complete"
    if done.exists():  # written once the library is whole
        return lib
    directory.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock, Timeout

    lock = FileLock(str(directory / "compile.lock"), timeout=LOCK_TIMEOUT_S)
    try:
        lock.acquire(timeout=0)
    except Timeout:  # another process is compiling: say so, then wait for it (bounded)
        print(f"emulator: another process is compiling the emulated device into {directory}; waiting for it"
              f" (at most {LOCK_TIMEOUT_S:.0f} s)", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        if not done.exists():  # else another process compiled it while this one waited
            _compile(directory, done, verbose)
    finally:
        lock.release()
    return lib


def _compile(directory: Path, done: Path, verbose: bool) -> None:
    """Compile the extension into ``directory`` (the caller holds the compile lock); ``done`` marks it whole."""
    check_toolchain()
    from torch.utils import cpp_extension

    os.environ.setdefault("MAX_JOBS", "2")
    # Kineto's headers (the device's activity profiler, csrc/profiler.cpp) include each other by bare name
    kineto = [str(Path(p) / "kineto") for p in cpp_extension.include_paths() if (Path(p) / "kineto").is_dir()]
    print(f"emulator: compiling the emulated device for torch {torch.__version__} into {directory}"
          " (once per torch version: about one to two minutes)", file=sys.stderr, flush=True)
    start = time.monotonic()
    cpp_extension.load(name=EXTENSION, sources=[str(s) for s in SOURCES], build_directory=str(directory),
                       extra_cflags=["-O1"], extra_include_paths=kineto, is_python_module=True, verbose=verbose)
    done.write_text(f"{torch.__version__}\n")
    print(f"emulator: compiled in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def import_extension() -> ModuleType:
    """The extension module, compiled first if needed."""
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
    start = time.perf_counter()
    path = build(verbose="-v" in sys.argv)
    print(f"emulator extension: {path} ({time.perf_counter() - start:.1f} s)")
