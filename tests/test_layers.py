"""docs/architecture.md's layer rule, checked on the package's real import graph.

The graph is read from the source with ``ast``: every ``import`` of a module of the package, also
those inside functions (a lazy import is a dependency too). Each module belongs to exactly one
layer of the page's list; a module imports only modules of its own layer or of the layers below,
and no chain of imports comes back to where it started. The modules next to the package in ``src/``
(the start-up hook's) are in the graph too, named on the page by their path from the repository root.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "lightning_anyaccel"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: Every module of src/: the package's and those beside it (the start-up hook's).
MODULES = {_module_name(path): path for path in [*PACKAGE.rglob("*.py"), *SRC.glob("*.py")]}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import module`` counts as that module)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    imported.add(submodule if submodule in MODULES else node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = {m for m in imported if m in MODULES and m != name}
    return graph


def layers() -> list[tuple[str, list[str]]]:
    """The layers of docs/architecture.md, bottom first: (title, the paths each names, relative to the package)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## The layers", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^\d+\. \*\*([^*]+)\*\* \(([^)]*)\)", section, flags=re.MULTILINE)
    return [(title, re.findall(r"`([\w/.]+)`", paths)) for title, paths in found]


def _page_path(module: str) -> str:
    """How the page names a module: from the package's folder, or from the repository root outside it."""
    path = MODULES[module]
    return (path.relative_to(PACKAGE) if path.is_relative_to(PACKAGE) else path.relative_to(ROOT)).as_posix()


def _layer_of(module: str, rule: list[tuple[str, list[str]]]) -> list[int]:
    path = _page_path(module)
    return [index for index, (_, paths) in enumerate(rule)
            if any(path == p or (p.endswith("/") and path.startswith(p)) for p in paths)]


def test_every_module_is_in_exactly_one_layer() -> None:
    rule = layers()
    assert len(rule) >= 5, rule
    placed = {module: _layer_of(module, rule) for module in MODULES}
    assert {m: where for m, where in placed.items() if len(where) != 1} == {}


def test_every_import_goes_down_or_across() -> None:
    rule = layers()
    graph = import_graph()
    layer = {module: _layer_of(module, rule)[0] for module in MODULES}
    upward = sorted(f"{m} ({rule[layer[m]][0]}) imports {d} ({rule[layer[d]][0]})"
                    for m, deps in graph.items() for d in deps if layer[d] > layer[m])
    assert upward == []


def test_no_import_cycle() -> None:
    graph = import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []


def test_the_graph_sees_the_modules_beside_the_package() -> None:
    """The start-up hook's module imports the package (when Lightning is imported): an edge like any other."""
    assert "lightning_anyaccel" in import_graph()["_lightning_anyaccel_startup"]


def test_the_graph_sees_lazy_imports() -> None:
    """An import inside a function is an edge too (verify imports the checks' helpers when it runs)."""
    assert "lightning_anyaccel.device.distributed" in import_graph()["lightning_anyaccel.kit.verify"]


#: The most lines a module of src/ or of the documentation's extension (docs/_ext/) may have, blank lines not
#: counted (docs/architecture.md, "The layers").
MAX_MODULE_LINES = 400
#: The documentation's Sphinx extension and its helpers: held to the same bound as the package.
DOCS_EXTENSION = sorted((ROOT / "docs" / "_ext").glob("*.py"))


def _over_the_bound(paths: dict[str, Path]) -> dict[str, int]:
    """The modules of ``paths`` with more than :data:`MAX_MODULE_LINES` lines with text, and their count."""
    lengths = {name: sum(1 for line in path.read_text().splitlines() if line.strip()) for name, path in paths.items()}
    return {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES}


def test_no_module_over_the_bound() -> None:
    """Every module of src/ and of docs/_ext/ stays within :data:`MAX_MODULE_LINES` lines with text (code,
    docstrings, comments)."""
    assert len(DOCS_EXTENSION) > 1 and any(path.name == "anyaccel_docs.py" for path in DOCS_EXTENSION)
    assert _over_the_bound({**MODULES, **{f"docs/_ext/{path.name}": path for path in DOCS_EXTENSION}}) == {}


def test_the_bound_finds_a_long_module(tmp_path: Path) -> None:
    """The count skips blank lines and finds a module past the bound."""
    long = tmp_path / "long.py"
    long.write_text("x = 1\n\n" * MAX_MODULE_LINES + "y = 2\n")
    assert _over_the_bound({"long": long}) == {"long": MAX_MODULE_LINES + 1}
    long.write_text("x = 1\n\n" * MAX_MODULE_LINES)
    assert _over_the_bound({"long": long}) == {}


#: The most modules directly in the package's folder (docs/architecture.md, "The layers"): the plugin's
#: faces and foundation, and the commands' thin entries; everything else lives in a subpackage.
MAX_ROOT_MODULES = 12


def test_the_package_root_stays_small() -> None:
    """The root reads as the plugin: at most :data:`MAX_ROOT_MODULES` modules, the kit's code under ``kit/``."""
    root = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
    kit_entries = {"verify.py", "validate.py", "emulate.py"}
    thick = {name: n for name in kit_entries
             if (n := sum(1 for line in (PACKAGE / name).read_text().splitlines() if line.strip())) > 20}
    assert thick == {}, f"a command's entry only runs kit/'s implementation: {thick}"
