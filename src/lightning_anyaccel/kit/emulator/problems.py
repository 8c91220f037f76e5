"""What one process of a program run on the emulated device found, for ``python -m lightning_anyaccel.emulate``.

:func:`install` (run by the autoload hook when ``LIGHTNING_ANYACCEL_EMULATE_REPORT`` names a folder)
records, each with the user's own frames first (frames of the standard library, installed packages
and this package are left out):

- ``torch.cuda.*`` called while CUDA is not there (every public function of ``torch.cuda`` is
  wrapped; the call still runs);
- the error that ends the process: a tensor on another device (torch's same-device check, which the
  emulated device runs on every operator), out of memory (with the size asked for), CUDA missing
  (``.cuda()``, ``device="cuda"``), any other error;
- the collectives issued and never waited for, at exit;
- the optimizer steps taken (``torch.optim``'s global step hook).

The process writes ``<folder>/<pid>.json`` (:func:`report`) when something is recorded and at exit.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import json
import os
import re
import sys
import sysconfig
import time
import traceback
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import torch

#: The folder the processes write their reports to.
REPORT_ENV = "LIGHTNING_ANYACCEL_EMULATE_REPORT"
#: How many of the user's frames a problem keeps.
FRAMES = 4

_PACKAGE = str(Path(__file__).resolve().parents[2])
_LIBRARIES = tuple(sorted({str(Path(p).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib")
                           if (p := sysconfig.get_paths().get(key))} | {_PACKAGE}, key=len, reverse=True))
_state: dict[str, Any] = {"problems": [], "steps": 0, "written": 0.0, "installed": False}


def is_user_file(filename: str) -> bool:
    """A frame of the user's code: not Python's own, not an installed package's, not this package's."""
    if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
        return False
    try:
        resolved = str(Path(filename).resolve())
    except OSError:
        return True
    return not any(resolved == lib or resolved.startswith(lib + os.sep) for lib in _LIBRARIES)


def _user_frames(frames: list[tuple[str, int, str]]) -> list[dict[str, Any]]:
    """The user's frames, innermost first, with their source lines."""
    import linecache

    picked = [{"file": f, "line": n, "function": fn, "code": linecache.getline(f, n).strip()}
              for f, n, fn in frames if is_user_file(f)]
    return list(reversed(picked))[:FRAMES]


def _stack(frame: FrameType | None) -> list[tuple[str, int, str]]:
    """Outermost first, like a traceback."""
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return list(reversed(frames))


def record(kind: str, message: str, frames: list[tuple[str, int, str]], **details: str) -> None:
    """Note a problem once per place of the user's code (``details``: ``api``, the ``torch.cuda`` function;
    ``origin``, where a stray tensor was made)."""
    where = _user_frames(frames)
    if not where and kind == "error":  # a launcher's or a library's own failure (torchrun's ChildFailedError)
        return
    key = (kind, where[0]["file"], where[0]["line"]) if where else (kind, message)
    if any(p["key"] == list(key) for p in _state["problems"]):
        return
    if kind != "CUDA-only API" and where and any(
            p["kind"] == "CUDA-only API" and p["key"][1:] == [where[0]["file"], where[0]["line"]]
            for p in _state["problems"]):
        return  # the torch.cuda call noted at this line failing for want of CUDA: the same problem, one fix
    _state["problems"].append({"key": list(key), "kind": kind, "message": message, "frames": where, **details})
    report()


# ------------------------------------------------------------------------------ what is recorded


def _classify(error: BaseException) -> tuple[str, str]:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if isinstance(error, torch.OutOfMemoryError):
        size = re.search(r"Tried to allocate ([\d.]+ \w+)", str(error))
        return "out of memory", f"out of memory allocating {size.group(1) if size else 'a tensor'}: {text}"
    if "Expected all tensors to be on the same device" in text:
        return "tensor on another device", text
    if re.search(r"not compiled with CUDA|NVIDIA driver|CUDA driver|No CUDA GPUs|cuda", text, re.IGNORECASE):
        return "CUDA-only code", text
    return "error", f"{type(error).__name__}: {text}"


def _excepthook(previous: Any, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    if not isinstance(error, (KeyboardInterrupt, SystemExit)):
        found, message = _classify(error)
        # the innermost exception's traceback: Lightning re-raises from its own frames
        chain: BaseException | None = error
        frames: list[tuple[str, int, str]] = []
        while chain is not None:
            frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(chain.__traceback__)] + frames
            chain = chain.__cause__ or chain.__context__
        details = {"origin": stray_tensor_origin(_innermost_user_frame(error))} if found == "tensor on another device" \
            else {}
        record(found, message, frames, **details)
    previous(kind, error, tb)


def _innermost_user_frame(error: BaseException) -> FrameType | None:
    """The user's frame nearest to where ``error`` (or the error it was raised from) happened."""
    found: FrameType | None = None
    chain: BaseException | None = error
    while chain is not None and found is None:
        tb = chain.__traceback__
        while tb is not None:
            if is_user_file(tb.tb_frame.f_code.co_filename):
                found = tb.tb_frame
            tb = tb.tb_next
        chain = chain.__cause__ or chain.__context__
    return found


def stray_tensor_origin(frame: FrameType | None) -> str:
    """Where the CPU tensor of a same-device error was made: the line that assigned a local variable of the
    failing function holding a CPU tensor (beside one on a device), or a sentence saying it is not known."""
    if frame is None:
        return "where the CPU tensor was made is not known: no frame of your code was running"
    tensors = {name: v for name, v in frame.f_locals.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    on_cpu = [name for name, v in tensors.items() if v.device.type == "cpu"]
    if not on_cpu or all(v.device.type == "cpu" for v in tensors.values()):
        return (f"where the CPU tensor was made is not known: it is no local variable of {frame.f_code.co_name}()"
                " (an attribute, a global or a function's result: look for a tensor made without device=)")
    made = _assignments(frame, set(on_cpu))
    where = [f"{name} made on the CPU at {frame.f_code.co_filename}:{line}: {code}" for name, (line, code) in made.items()]
    unknown = [name for name in on_cpu if name not in made]
    if unknown:
        where.append(f"{', '.join(unknown)} on the CPU (not assigned in {frame.f_code.co_name}(): an argument)")
    return "; ".join(where)


def _assignments(frame: FrameType, names: set[str]) -> dict[str, tuple[int, str]]:
    """The last line of ``frame``'s function, up to where it stopped, that assigned each of ``names``."""
    import ast
    import linecache

    code = frame.f_code
    source = "".join(linecache.getlines(code.co_filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    made: dict[str, tuple[int, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == code.co_name \
                and node.lineno <= frame.f_lineno <= (node.end_lineno or node.lineno):
            for inner in ast.walk(node):
                if not isinstance(inner, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    continue
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in names and inner.lineno < frame.f_lineno \
                            and inner.lineno >= made.get(target.id, (0, ""))[0]:
                        made[target.id] = (inner.lineno, linecache.getline(code.co_filename, inner.lineno).strip())
    return made


def _wrap_cuda_api() -> None:
    """Every public function of ``torch.cuda``, noted when the user's code calls it (CUDA is not there)."""
    import torch.cuda

    def wrapped(name: str, function: Any) -> Any:
        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            if is_user_file(caller.f_code.co_filename):
                record("CUDA-only API", f"torch.cuda.{name}() called: the emulated device is not CUDA",
                       _stack(caller), api=name)
            return function(*args, **kwargs)

        return call

    for name, value in list(vars(torch.cuda).items()):
        if not name.startswith("_") and inspect.isfunction(value) and value.__module__.startswith("torch.cuda"):
            setattr(torch.cuda, name, wrapped(name, value))


def _count_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    _state["steps"] += 1
    if time.monotonic() - _state["written"] > 1.0:
        report()


def _unwaited_collectives() -> None:
    from lightning_anyaccel.kit.emulator import collectives

    for work in collectives.pending_works():
        record("collective not waited for", "a collective was issued (async_op=True) and never waited for:"
               " call work.wait() before reading its result", getattr(work, "_issued_at", []))


def _note_issue(work: Any) -> None:
    work._issued_at = _stack(sys._getframe(1))


# ------------------------------------------------------------------------------ the report


def _rank() -> int | None:
    for key in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return None


def report() -> None:
    """Write this process's report (``<folder>/<pid>.json``, replaced whole)."""
    folder = os.environ.get(REPORT_ENV, "").strip()
    if not folder:
        return
    from lightning_anyaccel.kit.emulator.names import ENV_VAR, parse_spec

    data = {"pid": os.getpid(), "rank": _rank(), "argv": sys.argv, "device": parse_spec(os.environ.get(ENV_VAR, ""))[0],
            "steps": _state["steps"], "problems": _state["problems"]}
    path = Path(folder) / f"{os.getpid()}.json"
    partial = path.with_suffix(".partial")
    try:
        partial.write_text(json.dumps(data))
        partial.replace(path)
    except OSError:  # the run command ended and took its folder: nothing left to tell
        return
    _state["written"] = time.monotonic()


def _at_exit() -> None:
    _unwaited_collectives()
    report()


def install() -> None:
    """Start recording in this process (idempotent)."""
    if _state["installed"]:
        return
    _state["installed"] = True
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from lightning_anyaccel.kit.emulator import collectives

    register_optimizer_step_post_hook(_count_step)
    collectives.on_issue = _note_issue
    _wrap_cuda_api()
    sys.excepthook = functools.partial(_excepthook, sys.excepthook)
    atexit.register(_at_exit)
    report()
