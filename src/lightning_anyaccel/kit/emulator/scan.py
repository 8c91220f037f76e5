"""The static scan: CUDA-only code in a program's Python files, each with code that replaces it.

Reads files with :mod:`ast` and never writes one. It finds ``torch.cuda.*`` (also under ``import torch
as th`` and ``from torch import cuda``), ``.cuda()``, a ``"cuda"`` device string where a device is meant
(``device="cuda"``, ``.to("cuda")``, ``torch.device("cuda:0")``, a variable or constant holding one,
``DEVICE = "cuda"``, with the lines that use it, an ``os.environ`` default or value, a parameter's default), ``torch.backends.cudnn``
flags, ``pin_memory_device=``, the ``"nccl"`` backend and ``accelerator="gpu"``/``"cuda"``.

Each :class:`Finding`'s ``replacement`` is code that takes the place of the flagged code as it stands
(an expression for an expression, ``name=value`` for a keyword argument, a statement for a statement) and
runs where the original ran: on a machine with no accelerator (the CPU), on the emulated device and on
a real one. It names torch as the file imports it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import override

#: The accelerator in use, or the CPU where the machine has none (``{t}``: the file's name for torch).
IN_USE = '{t}.accelerator.current_accelerator() or {t}.device("cpu")'
#: The device module of the accelerator in use (``torch.cpu`` on a machine without one).
MODULE = "{t}.get_device_module()"

#: ``torch.cuda.<name>(...)`` -> code for every device (``{args}``: the call's own arguments), and a note.
CUDA_REPLACEMENTS: dict[str, tuple[str, str]] = {
    "is_available": ("{t}.accelerator.is_available()", ""),
    "device_count": ("{t}.accelerator.device_count()", ""),
    "current_device": (MODULE + ".current_device()", "an index on an accelerator, 'cpu' without one"),
    "set_device": (MODULE + ".set_device({args})", ""),
    "synchronize": (MODULE + ".synchronize({args})", ""),
    "current_stream": (MODULE + ".current_stream({args})", ""),
    "stream": (MODULE + ".stream({args})", ""),
    "Stream": (MODULE + ".Stream({args})", ""),
    "Event": (MODULE + ".Event({args})", ""),
    "manual_seed": ("{t}.manual_seed({args})", "seeds every device; or lightning.seed_everything(seed)"),
    "manual_seed_all": ("{t}.manual_seed({args})", "seeds every device; or lightning.seed_everything(seed)"),
    "autocast": ("{t}.autocast((" + IN_USE + ").type, {args})", "or Trainer(precision=\"bf16-mixed\")"),
    "GradScaler": ("{t}.amp.GradScaler((" + IN_USE + ").type, {args})", "or Trainer(precision=\"16-mixed\")"),
}
#: Any other ``torch.cuda.<name>(...)``: the device module's function where it has one, else nothing happens.
DEFAULT_REPLACEMENT = ('getattr(' + MODULE + ', "{name}", lambda *args, **kwargs: None)({args})',
                       "the device's own module; None where it has no {name}")
#: Directories the scan of a folder never enters.
SKIPPED_DIRS = {".git", ".hg", ".venv", "venv", "env", "site-packages", "node_modules", "__pycache__",
                "build", "dist", ".tox", ".nox", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class Finding:
    """One CUDA-only construct: where, what, the code that replaces it (``form``: ``expression``, ``keyword``
    or ``statement``) and a note."""

    path: str
    line: int
    what: str
    replacement: str
    code: str
    form: str = "expression"
    note: str = ""

    @override
    def __str__(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        return f"{self.path}:{self.line}: {self.what} -> {self.replacement}{note}\n    {self.code}"


def _is_cuda_string(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value == "cuda" or node.value.startswith("cuda:"))


def _args_text(call: ast.Call) -> str:
    return ", ".join([ast.unparse(a) for a in call.args] + [ast.unparse(k) for k in call.keywords])


@dataclass
class _Visitor(ast.NodeVisitor):
    torch_names: set[str] = field(default_factory=lambda: {"torch"})
    imported_as: list[str] = field(default_factory=list)  # the file's names for torch, in import order
    cuda_names: set[str] = field(default_factory=set)
    #: name -> line of ``NAME = "cuda"`` / ``NAME = torch.device("cuda")``
    device_names: dict[str, int] = field(default_factory=dict)
    found: list[tuple[int, str, str, str, str]] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # ids of the nodes reported (each construct once)

    @property
    def t(self) -> str:
        return "torch" if "torch" in self.imported_as or not self.imported_as else self.imported_as[0]

    def _add(self, node: ast.AST, what: str, replacement: str, form: str = "expression", note: str = "") -> None:
        if id(node) not in self.seen:
            self.seen.add(id(node))
            self.found.append((getattr(node, "lineno", 0), what, replacement.format(t=self.t), form, note))

    def _in_use(self) -> str:
        return IN_USE.format(t=self.t)

    @override
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch":
                self.torch_names.add(alias.asname or "torch")
                self.imported_as.append(alias.asname or "torch")
            elif alias.name == "torch.cuda" and alias.asname:
                self.cuda_names.add(alias.asname)

    @override
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if node.module == "torch" and alias.name == "cuda":
                self.cuda_names.add(alias.asname or "cuda")
            elif node.module in ("torch.cuda", "torch.cuda.amp") and node.level == 0:
                self._add(node, f"from {node.module} import {alias.name}", "import torch", "statement",
                          f"then write {self._member_call(alias.name, '')[0]} where {alias.asname or alias.name}(...) is")

    def _cuda_member(self, node: ast.Attribute) -> str | None:
        """``torch.cuda.X`` / ``cuda.X`` / ``torch.cuda.amp.X`` -> ``X``."""
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "amp" and isinstance(value.value, ast.Attribute):
            inner = self._cuda_member(value)
            if inner == "amp":
                return node.attr
        if isinstance(value, ast.Attribute) and value.attr == "cuda" and isinstance(value.value, ast.Name) \
                and value.value.id in self.torch_names:
            return node.attr
        if isinstance(value, ast.Name) and value.id in self.cuda_names:
            return node.attr
        return None

    def _what(self, node: ast.expr, member: str) -> str:
        inner = node.value if isinstance(node, ast.Attribute) else node
        amp = isinstance(inner, ast.Attribute) and inner.attr == "amp" and isinstance(inner.value, ast.Attribute)
        return f"torch.cuda.{'amp.' if amp else ''}{member}"

    def _member_call(self, member: str, args: str) -> tuple[str, str]:
        code, note = CUDA_REPLACEMENTS.get(member, DEFAULT_REPLACEMENT)
        return code.format(t=self.t, args=args, name=member).replace(", )", ")"), note.format(name=member)

    def _device_value(self, node: ast.expr, what: str) -> None:
        """A ``"cuda"`` string where a device is meant: the name of the device type in use, a string as well."""
        note = "self.device in a LightningModule, x.device for a tensor x at hand"
        index = str(node.value).partition(":")[2]  # type: ignore[attr-defined]
        if index:
            note += f"; for index {index}: {self.t}.device(<that type>, {index})"
        self._add(node, what, f"({self._in_use()}).type", "expression", note)

    @override
    def visit_Attribute(self, node: ast.Attribute) -> None:
        member = self._cuda_member(node)
        if member is not None:
            code, note = self._member_call(member, "")
            self._add(node, self._what(node, member), code, "expression", note)
            return
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "cudnn" and isinstance(value.value, ast.Attribute) \
                and value.value.attr == "backends":
            self._add(node, f"torch.backends.cudnn.{node.attr}", "", "statement")
            return
        self.generic_visit(node)

    @override
    def visit_Assign(self, node: ast.Assign) -> None:
        flag = node.targets[0] if len(node.targets) == 1 else None
        if isinstance(flag, ast.Attribute) and flag.attr in ("benchmark", "deterministic") \
                and isinstance(flag.value, ast.Attribute) and flag.value.attr == "cudnn":
            flag_value = ast.unparse(node.value)
            code = (f"{self.t}.use_deterministic_algorithms({flag_value})" if flag.attr == "deterministic"
                    else f"lightning.Trainer(benchmark={flag_value})")
            self._add(flag, f"torch.backends.cudnn.{flag.attr}", code, "statement",
                      "the Trainer's benchmark=/deterministic= reach every device's libraries")
            return
        value = node.value
        is_device = _is_cuda_string(value) or (isinstance(value, ast.Call) and self._is_torch_device(value.func)
                                               and bool(value.args) and _is_cuda_string(value.args[0]))
        if is_device:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.device_names[target.id] = node.lineno
        if isinstance(value, ast.Constant) and _is_cuda_string(value):
            names = ", ".join(ast.unparse(t) for t in node.targets)
            self._device_value(value, f"device {value.value!r} in {names}")
        self.generic_visit(node)

    def _is_torch_device(self, func: ast.expr) -> bool:
        return (isinstance(func, ast.Attribute) and func.attr == "device" and isinstance(func.value, ast.Name)
                and func.value.id in self.torch_names) or (isinstance(func, ast.Name) and func.id == "device")

    @override
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        member = self._cuda_member(func) if isinstance(func, ast.Attribute) else None
        if member is not None:
            code, note = self._member_call(member, _args_text(node))
            self._add(func, self._what(func, member), code, "expression", note)
        elif isinstance(func, ast.Attribute) and func.attr == "cuda" \
                and not (isinstance(func.value, ast.Name) and func.value.id in self.torch_names):
            self._add(node, ".cuda()", f"{ast.unparse(func.value)}.to({self._in_use()})", "expression",
                      "in a LightningModule Lightning moves the model and batches itself")
        if (isinstance(func, ast.Attribute) and func.attr == "to") or self._is_torch_device(func):
            if node.args and _is_cuda_string(node.args[0]):
                self._device_value(node.args[0], f"device {node.args[0].value!r}")  # type: ignore[attr-defined]
        if self._is_environ_get(func) and len(node.args) > 1 and _is_cuda_string(node.args[1]):
            self._device_value(node.args[1], f"device {node.args[1].value!r} as the default of {ast.unparse(func)}")  # type: ignore[attr-defined]
        for keyword in node.keywords:
            if keyword.arg == "device" and _is_cuda_string(keyword.value):
                self._device_value(keyword.value, f"device={keyword.value.value!r}")  # type: ignore[attr-defined]
            elif keyword.arg == "pin_memory_device":
                self._add(keyword.value, "pin_memory_device=", "pin_memory=True", "keyword",
                          "torch pins for the accelerator in use")
            elif keyword.arg == "accelerator" and isinstance(keyword.value, ast.Constant) \
                    and keyword.value.value in ("gpu", "cuda"):
                self._add(keyword.value, f"accelerator={keyword.value.value!r}", 'accelerator="auto"', "keyword",
                          "finds whichever device the machine has")
        self.generic_visit(node)

    @override
    def visit_arguments(self, node: ast.arguments) -> None:
        """``def f(device="cuda")``: a parameter's default."""
        for default in [*node.defaults, *node.kw_defaults]:
            if default is not None and _is_cuda_string(default):
                self._device_value(default, f"device {default.value!r} as a parameter's default")  # type: ignore[attr-defined]
        self.generic_visit(node)

    @staticmethod
    def _is_environ_get(func: ast.expr) -> bool:
        """``os.environ.get`` / ``os.getenv`` / ``environ.get`` / ``getenv``."""
        text = ast.unparse(func)
        return text in ("os.environ.get", "environ.get", "os.getenv", "getenv", "os.environ.setdefault")

    @override
    def visit_Constant(self, node: ast.Constant) -> None:
        if node.value == "nccl":
            self._add(node, '"nccl"', f"{self.t}.distributed.get_default_backend_for_device({self._in_use()})",
                      "expression", "or leave the backend to Lightning's strategy, which picks the device's own")


def _uses(tree: ast.AST, names: dict[str, int]) -> dict[str, list[int]]:
    """The lines, after its assignment, where each device variable is read."""
    uses: dict[str, list[int]] = {name: [] for name in names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in names \
                and node.lineno != names[node.id]:
            uses[node.id].append(node.lineno)
    return {name: sorted(set(lines)) for name, lines in uses.items()}


def scan_source(source: str, path: str = "<string>") -> list[Finding]:
    """The findings in one file's source (a file that does not parse: none)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError:
        return []
    visitor = _Visitor()
    visitor.visit(tree)
    uses = _uses(tree, visitor.device_names)
    by_line = {line: name for name, line in visitor.device_names.items()}
    lines = source.splitlines()
    findings = []
    for line, what, replacement, form, note in sorted(visitor.found, key=lambda f: f[0]):
        if line in by_line and uses[by_line[line]]:
            used = ", ".join(map(str, uses[by_line[line]]))
            note = f"{note}; {by_line[line]} is used on line(s) {used}: fixed here, fixed there" if note \
                else f"{by_line[line]} is used on line(s) {used}: fixed here, fixed there"
        findings.append(Finding(path, line, what, replacement, lines[line - 1].strip() if 0 < line <= len(lines)
                                else "", form, note))
    return findings


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


def replacement_for(member: str, torch_name: str = "torch") -> str:
    """The code the scan suggests for ``torch.cuda.<member>(...)`` (the run's report names it too)."""
    return _Visitor(torch_names={torch_name})._member_call(member, "...")[0]
