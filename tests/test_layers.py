"""docs/architecture.md's layer rule, checked on the package's real import graph.

The graph is read from the source with ``ast``: every ``import`` of a module of the package, also
those inside functions (a lazy import is a dependency too). Each module belongs to exactly one
layer of the page's list; a module imports only modules of its own layer or of the layers below,
and no chain of imports comes back to where it started. The modules next to the package in ``src/``
(the start-up hook's) are in the graph too, named on the page by their path from the repository root.
"""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def _tree(module: str) -> ast.Module:
    """The syntax tree of ``module``, parsed once for all the checks of this file."""
    return ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``from pkg import module`` counts as that module)."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        imported: set[str] = set()
        for node in ast.walk(_tree(name)):
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


# ---- a device travels as its spec (docs/architecture.md, "How a device travels") ------------------------

#: What turns a device-type string into what the package knows about it (``device/devices.py``).
RESOLVERS = frozenset({"get_spec", "is_host", "device_of"})

#: Modules whose functions take the device as its ``DeviceSpec``: none resolves a device type.
SPEC_TAKERS = ("lightning_anyaccel.device.runtime",)

#: The modules the validation kit's device passes through, from the command line to the accelerator, and the
#: functions among them that hold a device type as a string: where it enters and becomes its spec (each resolves
#: it once at most), or where it is a record's field, compared and never resolved.
KIT_PATH = {
    "lightning_anyaccel.kit.validate": {"main": "the command line's --device (a check's process: the same)"},
    "lightning_anyaccel.kit.tools.validation_checks": {},
    "lightning_anyaccel.kit.verify": {"describe": "verify.describe's argument (public)",
                                      "run": "verify.run's argument (public) and verify's --device"},
    "lightning_anyaccel.kit.tools.parity_run": {"main": "the command line's --device-type"},
    "lightning_anyaccel.kit.tools.parity_gpt2": {},
    "lightning_anyaccel.kit.tools.parity_fabric": {},
    "lightning_anyaccel.kit.tools.records": {"build_record": "a record built from a test run's device type",
                                             "with_parity": "the record's device_type field, compared"},
    "lightning_anyaccel.accelerator": {
        "AnyAccelerator.__new__": "AnyAccelerator(device_type) (public): the instance keeps the spec",
        "AnyAccelerator._spec": "each method Lightning calls on the class, which holds the device type",
        "AnyAccelerator.bound": "the per-device class of a device type (registration, accelerator_class)",
        "AnyAccelerator.bound.is_available": "Lightning's connector asks the class",
        "AnyAccelerator.register_accelerators": "each device type the registration meets",
        "process_devices": "a strategy's parallel_devices",
        "accelerator_class": "the public function of a device type's class (bound resolves it)",
    },
}


def _functions(tree: ast.AST, prefix: str = "") -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of ``tree`` by its qualified name (``Class.method``, ``outer.inner``)."""
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[prefix + node.name] = node
            found.update(_functions(node, f"{prefix}{node.name}."))
        elif isinstance(node, ast.ClassDef):
            found.update(_functions(node, f"{prefix}{node.name}."))
    return found


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    """The nodes of ``function``'s body, without those of the functions and classes defined in it."""
    nodes: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            nodes.append(node)
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def resolutions(module: str) -> dict[str, int]:
    """Function -> how many places in it turn a device type into its spec (a resolver's call, a look-up in
    ``DEVICE_TABLE`` by a type), for the functions of ``module`` that have any."""
    tree = _tree(module)
    counts: dict[str, int] = {}
    for name, function in _functions(tree).items():
        n = 0
        for node in _own_nodes(function):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Name) and called.id in RESOLVERS or \
                    isinstance(called, ast.Attribute) and called.attr in RESOLVERS:
                n += 1
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "DEVICE_TABLE"
                  and isinstance(node.ctx, ast.Load)) or (
                    isinstance(called, ast.Attribute) and called.attr == "get"
                    and isinstance(called.value, ast.Name) and called.value.id == "DEVICE_TABLE"):
                n += 1
        if n:
            counts[name] = n
    return counts


def device_type_parameters(module: str) -> list[str]:
    """``function(parameter)`` for each parameter of ``module``'s functions that takes a device type as a string."""
    found = []
    for name, function in _functions(_tree(module)).items():
        arguments = function.args
        for parameter in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            annotation = ast.unparse(parameter.annotation) if parameter.annotation else ""
            if "device" in parameter.arg and re.fullmatch(r"str( \| None)?", annotation):
                found.append(f"{name}({parameter.arg})")
    return found


def test_the_device_layer_takes_the_spec() -> None:
    """The runtime's functions take the ``DeviceSpec`` their caller resolved: no device-type string, no look-up."""
    for module in SPEC_TAKERS:
        assert device_type_parameters(module) == [], f"{module}: take `spec: DeviceSpec` instead"
        assert resolutions(module) == {}, f"{module} resolves a device type again: take the caller's spec"


def test_the_kit_resolves_the_device_once_where_it_enters() -> None:
    """Along the validation kit's path a device type becomes its spec only where it enters, once there; every
    function after that receives the spec (a function that takes a device type as a string is a second entry)."""
    for module, entries in KIT_PATH.items():
        found = resolutions(module)
        assert set(found) <= set(entries), (f"{module}: {sorted(set(found) - set(entries))} resolve a device type"
                                            " that an earlier function already resolved: pass its spec")
        assert {name: n for name, n in found.items() if n > 1} == {}, f"{module}: resolve once per entry"
        strings = [p for p in device_type_parameters(module) if p.split("(")[0] not in entries]
        assert strings == [], f"{module}: {strings} take a device type as a string: take its spec"


def test_the_structure_checks_see_a_resolution() -> None:
    """The checks above read the code they are meant to: the places where a device enters resolve it."""
    assert resolutions("lightning_anyaccel.kit.validate") == {"main": 1}
    assert resolutions("lightning_anyaccel.device.devices")["device_of"] == 1  # its look-up in the table


# ---- the device's walk: each module of the kit entered once (docs/architecture.md, "How a device travels") ----

#: Where the validation kit's device begins its walk: a check's process, with the spec its ``main`` resolved.
WALK_START = ("lightning_anyaccel.kit.tools.validation_checks", "worker", "spec")
#: The module whose class, called with the device, makes the accelerator: what it returns is the device too.
ACCELERATOR = "lightning_anyaccel.accelerator"


def _on_kit_path(module: str) -> bool:
    """The modules the walk follows: the kit's and the accelerator's (the layers below serve the spec: not followed)."""
    return module.startswith("lightning_anyaccel.kit.") or module == ACCELERATOR


@functools.cache
def _bound_names(module: str) -> dict[str, tuple[str, str | None]]:
    """Each name ``module`` binds to the package -> (module, its function or class; ``None`` for a module), its
    imports inside functions too, and its own top-level functions and classes."""
    tree = _tree(module)
    names: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lightning_anyaccel"):
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names[alias.asname or alias.name] = (submodule, None) if submodule in MODULES else (str(node.module),
                                                                                                    alias.name)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = (module, node.name)
    return names


def _callee(module: str, function: ast.expr) -> tuple[str, str] | None:
    """(module, function or class) of the package that a call in ``module`` reaches: ``f(...)`` or ``m.f(...)``
    (``m`` a module of the package); ``None`` for anything else (methods, other packages)."""
    names = _bound_names(module)
    if isinstance(function, ast.Name) and function.id in names:
        found, name = names[function.id]
        return (found, name) if name is not None else None
    if isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and function.value.id in names:
        found, name = names[function.value.id]
        return (found, function.attr) if name is None else None
    return None


def _is_device(node: ast.expr, forms: set[str], module: str) -> bool:
    """Whether ``node`` is the device: a name holding it, an attribute or a method's result of it
    (``spec.device(0)``, ``accelerator.spec``), or the accelerator built from it (``AnyAccelerator(spec)``)."""
    if isinstance(node, ast.Name):
        return node.id in forms
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return _is_device(node.value, forms, module)
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and _is_device(node.func.value, forms, module):
            return True
        callee = _callee(module, node.func)
        return callee is not None and callee[0] == ACCELERATOR and any(
            _is_device(arg, forms, module) for arg in [*node.args, *(k.value for k in node.keywords)])
    return False


def _carries(node: ast.expr, forms: set[str]) -> bool:
    return any(isinstance(child, ast.Name) and child.id in forms for child in ast.walk(node))


def _receivers(module: str, name: str, call: ast.Call, forms: set[str]) -> dict[str, set[str]]:
    """The functions of ``module`` that ``call`` of ``name`` runs (a class: its ``__new__`` and ``__init__``) -> the
    parameters that receive the device."""
    functions = _functions(_tree(module))
    targets = [f"{name}.{method}" for method in ("__new__", "__init__") if f"{name}.{method}" in functions] or [name]
    found: dict[str, set[str]] = {}
    for target in (t for t in targets if t in functions):
        arguments = functions[target].args
        positional = [p.arg for p in [*arguments.posonlyargs, *arguments.args]]
        if "." in target and positional[:1] in (["self"], ["cls"]):
            positional = positional[1:]
        received = {positional[i] for i, arg in enumerate(call.args) if i < len(positional) and _carries(arg, forms)}
        received |= {k.arg for k in call.keywords if k.arg and _carries(k.value, forms)}
        found[target] = received
    return found


def device_walk(module: str, function: str, parameter: str) -> list[str]:
    """The modules of the kit's path (the kit's and the accelerator's) that a device entering ``module.function`` as
    ``parameter`` enters, in the order the code is written: each call that passes it on (it, or what is made of it:
    :func:`_is_device`) to a function of such a module enters that module, and the walk goes on in that function
    (once per function) with the parameters that receive it; a module entered again after another is listed again,
    calls one after the other within one module are one entry. Branches are walked one after the other."""
    entered: list[str] = [module]
    walked: set[tuple[str, str]] = set()

    def walk(module: str, function: str, forms: set[str]) -> None:
        walked.add((module, function))
        nodes = sorted((n for n in ast.walk(_functions(_tree(module))[function]) if isinstance(n, (ast.Assign, ast.Call))),
                       key=lambda n: (n.lineno, n.col_offset))
        for node in nodes:
            if isinstance(node, ast.Assign):
                if _is_device(node.value, forms, module):
                    forms |= {target.id for target in node.targets if isinstance(target, ast.Name)}
                continue
            callee = _callee(module, node.func)
            passed = [arg for arg in [*node.args, *(k.value for k in node.keywords)] if _carries(arg, forms)]
            if callee is None or not passed or not _on_kit_path(callee[0]):
                continue
            if entered[-1] != callee[0]:
                entered.append(callee[0])
            for target, received in _receivers(*callee, node, forms).items():
                if (callee[0], target) not in walked:
                    walk(callee[0], target, received)

    walk(module, function, {parameter})
    return entered


def test_the_device_enters_each_module_of_the_kit_once() -> None:
    """From a check's worker the device goes on as its spec, or as the accelerator built from it once, into each
    module of the kit's path once: each kind of check runs in its own module (the all-reduce in ``kit/verify.py``,
    a parity check's rank in ``parity_run.py``, the GPT-2's parity in ``parity_gpt2.py``), and none hands the
    device back to a module it has left (a helper of the worker's module called after the device went on)."""
    walk = device_walk(*WALK_START)
    again = sorted({module for i, module in enumerate(walk) if module in walk[:i]})
    assert again == [], f"the device enters {again} again along {walk}: call each kind of check's module from one place"
    kit = "lightning_anyaccel.kit."
    assert {f"{kit}verify", ACCELERATOR, f"{kit}tools.parity_run", f"{kit}tools.parity_gpt2"} <= set(walk), walk
