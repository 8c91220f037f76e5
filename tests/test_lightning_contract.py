"""The contract with Lightning's internals (``src/lightning_anyaccel/_lightning/``), checked on what is installed.

Fast (no process, no training): every private Lightning name and attribute the package uses
exists, with the parameters the package passes, in ``lightning`` and in ``pytorch_lightning`` /
``lightning_fabric``; and the package touches no private Lightning name that the contract does
not list. A failure names the Lightning version and the package function that depends on it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from lightning_anyaccel import _lightning
from lightning_anyaccel._lightning import stubs as lightning_stubs

SRC = Path(__file__).resolve().parents[1] / "src" / "lightning_anyaccel"
#: The emulated device: a torch backend (torch's private backend API, as vendors' plugins use it), no Lightning.
EMULATOR = SRC / "kit" / "emulator"
INSTALLED = [distribution for distribution in _lightning.DISTRIBUTIONS if distribution.is_installed()]

#: Private names the package uses that are not Lightning's, or are the package's own but set dynamically.
NOT_LIGHTNING = {
    "_exit": "os._exit in supervision.end_process (ends a process whose main thread is stuck in C)",
    "_Environ": "os._Environ, a type annotation in gloo_interface.configure_socket_interface",
    "_unbound": "the package's own class attribute, set by AnyAccelerator.bound",
}


def _version(distribution: _lightning.Distribution) -> str:
    return f"{distribution.package} {distribution.module(distribution.trainer if distribution.package != 'lightning' else 'lightning').__version__}"


def _lookup(dotted: str, distribution: _lightning.Distribution) -> object:
    module_name, _, attr = dotted.rpartition(".")
    try:
        return getattr(distribution.module(module_name), attr)
    except (ImportError, AttributeError):
        module_name, _, outer = module_name.rpartition(".")
        return getattr(getattr(distribution.module(module_name), outer), attr)


@pytest.mark.parametrize("distribution", INSTALLED, ids=lambda f: f.package)
@pytest.mark.parametrize("entry", _lightning.PRIVATE_NAMES, ids=lambda e: f"{e.module}.{e.name}")
def test_private_name_exists_with_its_parameters(distribution, entry) -> None:
    where = f"{entry.module}.{entry.name} (used by lightning_anyaccel {entry.used_by}; {_version(distribution)})"
    module = distribution.module(entry.module)
    assert hasattr(module, entry.name), f"{where} is gone"
    if entry.parameters is not None:
        parameters = list(inspect.signature(getattr(module, entry.name)).parameters)
        assert parameters[: len(entry.parameters)] == list(entry.parameters), f"{where} now takes {parameters}"


def _assigned_or_defined(cls: type, name: str) -> bool:
    if any(name in vars(klass) for klass in cls.__mro__):
        return True
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] not in ("lightning", "pytorch_lightning", "lightning_fabric"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if f"self.{name} =" in source or f"self.{name}:" in source:
            return True
    return False


@pytest.mark.parametrize("distribution", INSTALLED, ids=lambda f: f.package)
@pytest.mark.parametrize("entry", _lightning.PRIVATE_ATTRIBUTES, ids=lambda e: f"{e.owner}.{e.name}")
def test_private_attribute_exists(distribution, entry) -> None:
    owner = _lookup(entry.owner, distribution)
    assert isinstance(owner, type)
    assert _assigned_or_defined(owner, entry.name), (
        f"{entry.owner}.{entry.name} is neither defined nor set any more (used by lightning_anyaccel"
        f" {entry.used_by}; {_version(distribution)})"
    )


def _attribute_by_string(node: ast.AST) -> str | None:
    """The private name ``getattr``/``hasattr``/``setattr``/``delattr`` reads by its string (``getattr(x, "_a")``)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        name = node.args[1].value
        return name if name.startswith("_") and not name.startswith("__") else None
    return None


def _private_uses() -> tuple[dict[str, list[str]], set[str], list[str], dict[str, list[str]]]:
    """Private names used (as attributes), defined by the package, imported from Lightning, and read by their string
    (``getattr(x, "_a")``) outside the contract package."""
    used: dict[str, list[str]] = {}
    by_string: dict[str, list[str]] = {}
    defined: set[str] = set()
    imports: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(EMULATOR):  # torch's backend API, no Lightning: test_the_emulator_touches_no_lightning
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
                defined.add(node.target.id)
            elif isinstance(node, ast.ImportFrom) and path.parent.name != "_lightning" and (node.module or "").split(".")[0] in (
                "lightning", "pytorch_lightning", "lightning_fabric"
            ):
                imports += [f"{path.name}: from {node.module} import {a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute):
                if isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    defined.add(node.attr)
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    used.setdefault(node.attr, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
            name = _attribute_by_string(node)
            if name is not None and path.parent.name != "_lightning":
                by_string.setdefault(name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return used, defined, imports, by_string


def test_no_private_lightning_name_outside_the_contract() -> None:
    """Every private name the package touches is its own, listed in the contract, or known not to be Lightning's."""
    used, defined, imports, by_string = _private_uses()
    listed = {a.name for a in _lightning.PRIVATE_ATTRIBUTES} | {n.name for n in _lightning.PRIVATE_NAMES}
    unlisted = {name: where for name, where in used.items() if name not in defined | listed | set(NOT_LIGHTNING)}
    assert not unlisted, f"private names used but not in lightning_anyaccel._lightning's contract: {unlisted}"
    assert not imports, f"private Lightning imports outside lightning_anyaccel._lightning: {imports}"
    # a listed name read by its string bypasses the contract's accessors: read it through one of them
    bypass = {name: where for name, where in by_string.items() if name in listed}
    assert not bypass, f"Lightning's private names read by their string outside lightning_anyaccel._lightning: {bypass}"


def test_the_emulator_touches_no_lightning() -> None:
    """The emulated device is left out of the private-name check above: of Lightning it imports public names only
    (its self-check's fit), and only its self-check imports Lightning at all."""
    found = []
    for path in sorted(EMULATOR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [(path.name, n) for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric")]
    assert {file for file, _ in found} <= {"selfcheck.py"}, found
    assert not [name for _, name in found if any(part.startswith("_") for part in name.split("."))], found


def test_every_known_non_lightning_name_is_still_used() -> None:
    """``NOT_LIGHTNING`` lists only names the package uses (a stale entry would hide a new use elsewhere)."""
    used, _, _, _ = _private_uses()
    assert not set(NOT_LIGHTNING) - set(used), f"listed in NOT_LIGHTNING but unused: {set(NOT_LIGHTNING) - set(used)}"


def test_private_launchers_are_the_listed_names() -> None:
    """The launcher classes _lightning imports (the package's launchers' bases) are the ones PRIVATE_NAMES lists."""
    for cls, dotted in ((_lightning.TrainerMultiProcessingLauncher, _lightning.TRAINER_MULTIPROCESSING_LAUNCHER),
                        (_lightning.FabricMultiProcessingLauncher, _lightning.FABRIC_MULTIPROCESSING_LAUNCHER)):
        module, _, name = dotted.rpartition(".")
        assert any(entry.module == module and entry.name == name for entry in _lightning.PRIVATE_NAMES)
        assert cls is _lookup(dotted, _lightning.LIGHTNING)


def _named_parameters(function: object) -> tuple[list[str], bool]:
    """The parameter names of ``function`` but ``self``/``cls``/``*args``/``**kwargs``, and whether it has those."""
    parameters = list(inspect.signature(function).parameters.values())
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    names = [p.name for p in parameters if p.kind not in variadic and p.name not in ("self", "cls")]
    return names, any(p.kind in variadic for p in parameters)


_HOOKS = [
    (hooks, name, lightning_class)
    for hooks in lightning_stubs.ALL_HOOKS
    for name in lightning_stubs.hooks_of(hooks)
    for lightning_class in hooks.stands_for
]


@pytest.mark.parametrize("distribution", INSTALLED, ids=lambda f: f.package)
@pytest.mark.parametrize(
    ("hooks", "name", "lightning_class"), _HOOKS, ids=lambda v: v.__name__ if isinstance(v, type) else str(v)
)
def test_declared_hook_exists_with_its_parameters(distribution, hooks, name, lightning_class) -> None:
    """Every hook lightning_stubs declares for the type checker is Lightning's, with the same parameter names.

    A declaration without ``*args``/``**kwargs`` has exactly Lightning's parameter names, in order; one
    with them (a hook whose other parameters differ between the classes it stands for) names only
    parameters Lightning's hook has.
    """
    where = f"{hooks.__name__}.{name}, declared for {lightning_class} ({_version(distribution)})"
    owner = _lookup(lightning_class, distribution)
    assert isinstance(owner, type)
    declared = inspect.getattr_static(hooks, name)
    actual = inspect.getattr_static(owner, name, None)
    assert actual is not None, f"{where} is gone"
    if isinstance(declared, property):
        assert isinstance(actual, property), f"{where} is no longer a property"
        for accessor in ("fget", "fset"):
            if getattr(declared, accessor) is not None:
                assert getattr(actual, accessor) is not None, f"{where} has no {accessor} any more"
        return
    assert isinstance(actual, type(declared)), f"{where} is now a {type(actual).__name__}"
    declared_names, declared_variadic = _named_parameters(getattr(hooks, name))
    actual_names, _ = _named_parameters(getattr(owner, name))
    if declared_variadic:
        assert set(declared_names) <= set(actual_names), f"{where} now takes {actual_names}"
    else:
        assert declared_names == actual_names, f"{where} now takes {actual_names}"


def test_every_hook_class_declares_hooks() -> None:
    """Each hook class declares something (a renamed or emptied declaration would check nothing)."""
    assert all(hooks.stands_for and lightning_stubs.hooks_of(hooks) for hooks in lightning_stubs.ALL_HOOKS)


def test_torch_answers_whether_a_privateuse1_profiler_is_registered() -> None:
    """torch's registry of a PrivateUse1 activity profiler (C++ only) answers in this process, where no backend
    registered one (the emulated device's does: tests/test_profiling.py); a torch without that registry answers None."""
    import torch

    header = Path(torch.__file__).parent / "include/torch/csrc/profiler/standalone/privateuse1_profiler.h"
    assert _lightning.privateuse1_profiler_registered() is (False if header.is_file() else None)


def test_private_refuses_unlisted_names() -> None:
    with pytest.raises(KeyError, match="not in lightning_anyaccel._lightning.PRIVATE_NAMES"):
        _lightning.private("lightning.fabric.utilities.distributed", "_sync_ddp")


def test_connector_hooks_installed_on_every_front_end() -> None:
    import lightning_anyaccel  # noqa: F401

    for distribution in INSTALLED:
        distribution.module(distribution.trainer)  # pytorch_lightning registers when it is imported
        for connector in (_lightning.TRAINER_CONNECTOR, _lightning.FABRIC_CONNECTOR):
            cls = _lookup(connector, distribution)
            assert vars(cls).get("__lightning_anyaccel_hooks__"), f"{connector} of {_version(distribution)} is not hooked"


def test_port_refuses_a_method_that_wraps_super() -> None:
    """Methods are shared between front ends; a decorator hiding zero-argument super() can not be."""
    import functools

    from lightning.pytorch.strategies import DDPStrategy

    class Broken(DDPStrategy):
        @functools.lru_cache  # noqa: B019
        def teardown(self) -> None:
            super().teardown()

    Broken.__module__ = "lightning_anyaccel.tests_only"
    if _lightning.PYTORCH_LIGHTNING not in INSTALLED:
        pytest.skip("pytorch_lightning is not installed")
    with pytest.raises(TypeError, match="wraps a function that uses super"):
        _lightning.port(Broken, _lightning.PYTORCH_LIGHTNING)


@pytest.mark.parametrize("module", ["_lightning", "wiring.policy", "wiring.registration", "pytorch_lightning", "lightning_fabric"])
def test_docstring_examples(module) -> None:
    import doctest
    import importlib

    mod = importlib.import_module(f"lightning_anyaccel.{module}")
    # the ported classes carry the docstrings (and examples) of the classes they were built from: module docstring only
    finder = doctest.DocTestFinder(recurse=module not in ("pytorch_lightning", "lightning_fabric"))
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(mod):
        runner.run(test)
    assert runner.failures == 0
    assert runner.tries > 0


@pytest.mark.parametrize("distribution", INSTALLED, ids=lambda f: f.package)
@pytest.mark.parametrize("front_end", ["pytorch", "fabric"])
def test_single_device_root_reads_where_a_single_device_strategy_trains(distribution, front_end) -> None:
    """``policy`` refuses Lightning's single-device strategy on another device type through this accessor."""
    import torch

    module = distribution.module(f"lightning.{front_end}.strategies")
    assert _lightning.single_device_root(module.SingleDeviceStrategy(device=torch.device("cpu"))) == torch.device("cpu")
    assert _lightning.single_device_root(module.DDPStrategy()) is None
