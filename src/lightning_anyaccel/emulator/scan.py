"""The static scan: CUDA-only code in a program's Python files, each with its device-generic replacement.

Reads files with :mod:`ast` and never writes one. It finds ``torch.cuda.*`` (also under ``import torch
as th`` and ``from torch import cuda``), ``.cuda()``, a ``"cuda"`` device string (``device="cuda"``,
``.to("cuda")``, ``torch.device("cuda:0")``), ``torch.backends.cudnn`` flags, ``pin_memory_device=``,
the ``"nccl"`` backend and ``accelerator="gpu"``/``"cuda"``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from typing_extensions import override

#: ``torch.cuda.<name>`` -> what serves every device type.
CUDA_REPLACEMENTS = {
    "is_available": "torch.accelerator.is_available()",
    "device_count": "torch.accelerator.device_count()",
    "current_device": "torch.accelerator.current_device_index()",
    "set_device": "torch.accelerator.set_device_index(index)",
    "synchronize": "torch.accelerator.synchronize()",
    "current_stream": "torch.accelerator.current_stream()",
    "set_stream": "torch.accelerator.set_stream(stream)",
    "Stream": "torch.Stream(device)",
    "Event": "torch.Event(device)",
    "manual_seed": "torch.manual_seed(seed) (seeds every device) or lightning.seed_everything(seed)",
    "manual_seed_all": "torch.manual_seed(seed) (seeds every device) or lightning.seed_everything(seed)",
    "amp": "torch.autocast(device_type=device.type) and torch.amp.GradScaler(device.type)",
    "get_device_name": "torch.get_device_module(device).get_device_name()",
    "get_device_properties": "torch.get_device_module(device).get_device_properties()",
}
#: For any other ``torch.cuda.<name>``: the device's own module has it where the backend offers it.
DEFAULT_REPLACEMENT = "torch.get_device_module(device).{name} (the device's module; None-safe: check hasattr)"
#: Directories the scan of a folder never enters.
SKIPPED_DIRS = {".git", ".hg", ".venv", "venv", "env", "site-packages", "node_modules", "__pycache__",
                "build", "dist", ".tox", ".nox", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class Finding:
    """One CUDA-only construct: where, what, and what to write instead."""

    path: str
    line: int
    what: str
    replacement: str
    code: str

    @override
    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what} -> {self.replacement}\n    {self.code}"


def _is_cuda_string(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value == "cuda" or node.value.startswith("cuda:"))


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.torch_names = {"torch"}
        self.cuda_names: set[str] = set()
        self.found: list[tuple[int, str, str]] = []

    def _add(self, node: ast.AST, what: str, replacement: str) -> None:
        self.found.append((getattr(node, "lineno", 0), what, replacement))

    @override
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch":
                self.torch_names.add(alias.asname or "torch")
            elif alias.name == "torch.cuda" and alias.asname:
                self.cuda_names.add(alias.asname)

    @override
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if node.module == "torch" and alias.name == "cuda":
                self.cuda_names.add(alias.asname or "cuda")
            elif node.module == "torch.cuda" and node.level == 0:
                self._add(node, f"from torch.cuda import {alias.name}",
                          CUDA_REPLACEMENTS.get(alias.name, DEFAULT_REPLACEMENT.format(name=alias.name)))

    def _cuda_member(self, node: ast.Attribute) -> str | None:
        """``torch.cuda.X`` / ``cuda.X`` -> ``X``."""
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "cuda" and isinstance(value.value, ast.Name) \
                and value.value.id in self.torch_names:
            return node.attr
        if isinstance(value, ast.Name) and value.id in self.cuda_names:
            return node.attr
        return None

    @override
    def visit_Attribute(self, node: ast.Attribute) -> None:
        member = self._cuda_member(node)
        if member is not None:
            self._add(node, f"torch.cuda.{member}",
                      CUDA_REPLACEMENTS.get(member, DEFAULT_REPLACEMENT.format(name=member)))
            return  # torch.cuda.amp.autocast: one finding
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "cudnn" and isinstance(value.value, ast.Attribute) \
                and value.value.attr == "backends":
            self._add(node, f"torch.backends.cudnn.{node.attr}",
                      "Trainer(deterministic=..., benchmark=...) or torch.use_deterministic_algorithms(True):"
                      " they reach every device's libraries")
            return
        self.generic_visit(node)

    @override
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and self._cuda_member(func) is None \
                and not (isinstance(func.value, ast.Name) and func.value.id in self.torch_names):
            self._add(node, ".cuda()", ".to(device) (in a LightningModule: self.device; Lightning moves the model"
                                       " and batches itself)")
        if isinstance(func, ast.Attribute) and func.attr == "to" or (
                isinstance(func, ast.Attribute) and func.attr == "device") or (
                isinstance(func, ast.Name) and func.id == "device"):
            if node.args and _is_cuda_string(node.args[0]):
                self._add(node, f"device {node.args[0].value!r}",  # type: ignore[attr-defined]
                          "the device in use: self.device in a LightningModule, or"
                          " torch.accelerator.current_accelerator()")
        for keyword in node.keywords:
            if keyword.arg == "device" and _is_cuda_string(keyword.value):
                self._add(keyword.value, f"device={keyword.value.value!r}",  # type: ignore[attr-defined]
                          "device=self.device in a LightningModule (or the device of a tensor at hand:"
                          " device=x.device), or torch.accelerator.current_accelerator()")
            elif keyword.arg == "pin_memory_device":
                self._add(keyword.value, "pin_memory_device=", "pin_memory=True alone: torch pins for the"
                                                               " current accelerator")
            elif keyword.arg == "accelerator" and isinstance(keyword.value, ast.Constant) \
                    and keyword.value.value in ("gpu", "cuda"):
                self._add(keyword.value, f"accelerator={keyword.value.value!r}",
                          'accelerator="auto" (lightning-anyaccel: "any") finds whichever device the machine has')
        self.generic_visit(node)

    @override
    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "nccl":
            self._add(node, '"nccl"', 'torch.distributed.get_default_backend_for_device(device), or leave the'
                                      " backend to Lightning's strategy (it picks the device's own)")


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """The findings in one file's source (a file that does not parse: none)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError:
        return []
    visitor = _Visitor()
    visitor.visit(tree)
    lines = source.splitlines()
    found = {(line, what): replacement for line, what, replacement in visitor.found}
    return [Finding(path, line, what, replacement, lines[line - 1].strip() if 0 < line <= len(lines) else "")
            for (line, what), replacement in sorted(found.items())]


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Each ``.py`` file given, and those in the folders given (not in virtual environments or caches)."""
    for path in paths:
        if path.is_file():
            yield path
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_dir() and (child.name in SKIPPED_DIRS or child.name.startswith(".")):
                    continue
                if child.is_dir() or child.suffix == ".py":
                    yield from python_files([child])


def scan(paths: Iterable[Path]) -> list[Finding]:
    """The findings in every Python file under ``paths``."""
    found: list[Finding] = []
    for file in python_files(paths):
        try:
            found.extend(scan_source(file.read_text(encoding="utf-8", errors="replace"), str(file)))
        except OSError:
            continue
    return found
