"""docs/architecture.md's "Adding a strategy family", checked on every row of ``FAMILIES`` (fast, in process).

Each step of the recipe that can go wrong has its check in :func:`recipe_problems`: the family's module
(``SETUP``, ``NAMES``), its classes on Lightning's class of each front end, its names (``any_``, the first
one the mixin's ``strategy_name``, the Lightning names each replaces being Lightning's names of that class),
the registration with both front ends, the vocabulary tables derived from the rows, the layer and the module
map of the page. ``test_a_wrong_row_is_found`` shows the checks fail on a row put together wrongly.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

import lightning_anyaccel  # noqa: F401  (registers the names)
from lightning_anyaccel.strategies import families
from lightning_anyaccel.strategies.base import Registered
from lightning_anyaccel.strategies.families import FAMILIES, Family

ROOT = Path(__file__).resolve().parents[1]

#: Lightning's registered names of a family's class that no name of the package replaces, and why.
NOT_REPLACED = {
    "deepspeed_stage_3_offload_nvme": "no NVMe preset: AnyDeepSpeedStrategy takes the offload devices and nvme_path",
    "deepspeed_stage_1_offload": "Fabric's alone (the Trainer has none): AnyDeepSpeedStrategy(stage=1, offload_optimizer=True)",
}


def _lightning_registries() -> dict[str, dict[str, str]]:
    """Lightning's registered strategy names -> their class's name, per front end."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    return {front: {name: entry["strategy"].__name__ for name, entry in registry.items() if not name.startswith("any_")}
            for front, registry in (("trainer", StrategyRegistry), ("fabric", STRATEGY_REGISTRY))}


def recipe_problems(family: Family) -> list[str]:
    """What is wrong with ``family``'s row and module, step by step of the recipe (empty: nothing)."""
    from lightning.fabric import strategies as fabric_strategies
    from lightning.pytorch import strategies as trainer_strategies

    problems = []
    module = importlib.import_module(f"lightning_anyaccel.strategies.{family.name}")
    # step 1: the module, its SETUP and NAMES, the classes on Lightning's class of each front end
    if getattr(module, "NAMES", None) is not family.names:
        problems.append(f"the row's names are not strategies/{family.name}.py's NAMES")
    setup = tuple(getattr(module, "SETUP", ()))
    for cls in (family.trainer, family.fabric):  # a front end may add its own steps (DeepSpeed's Trainer)
        steps = iter(getattr(cls, "setup_steps", ()))
        if not setup or not all(step in steps for step in setup):  # SETUP's steps, in order
            problems.append(f"{cls.__name__} does not run strategies/{family.name}.py's SETUP")
    lightning_class = family.lightning_class
    for front, package, cls in (("Trainer", trainer_strategies, family.trainer), ("Fabric", fabric_strategies, family.fabric)):
        base = getattr(package, lightning_class, None)
        if base is None or not issubclass(cls, base):
            problems.append(f"the {front} class {cls.__name__} is not on {package.__name__}.{lightning_class}")
    if family.fabric.__module__ != "lightning_anyaccel.fabric.strategies":
        problems.append(f"{family.fabric.__name__} is not published by fabric_class (module {family.fabric.__module__})")
    if getattr(family.trainer, "strategy_name", None) != family.own_name:
        problems.append(f"strategy_name {getattr(family.trainer, 'strategy_name', None)!r} is not the first name"
                        f" {family.own_name!r}")
    # the names: ours start with any_; each replaces Lightning's names of the family's class only
    lightning_names = _lightning_registries()
    replaced = set()
    for name, entry in family.names.items():
        if not name.startswith("any_"):
            problems.append(f"{name!r} does not start with 'any_'")
        for theirs in entry.replaces(name):
            replaced.add(theirs)
            classes = {registry[theirs] for registry in lightning_names.values() if theirs in registry}
            if classes != {lightning_class}:
                problems.append(f"{name!r} replaces {theirs!r}, which Lightning registers for {sorted(classes) or 'nothing'},"
                                f" not {lightning_class}")
    forgotten = {theirs for registry in lightning_names.values() for theirs, cls in registry.items()
                 if cls == lightning_class and theirs not in replaced | set(NOT_REPLACED)}
    if forgotten:
        problems.append(f"Lightning's {sorted(forgotten)} ({lightning_class}) are replaced by no name of the family")
    return problems


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_row_follows_the_recipe(family: Family) -> None:
    assert recipe_problems(family) == []


def test_a_wrong_row_is_found() -> None:
    """The checks fail where a step went wrong: the names of another family, a wrong replaced name."""
    ddp, fsdp = FAMILIES[1], FAMILIES[2]
    assert any("NAMES" in p for p in recipe_problems(dataclasses.replace(ddp, names=fsdp.names)))
    wrong = {**fsdp.names, "any_fsdp": Registered("FSDP", {}, ("ddp",))}
    problems = recipe_problems(dataclasses.replace(fsdp, names=wrong))
    assert any("replaces 'ddp'" in p for p in problems) and any("'fsdp'" in p for p in problems), problems


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_name_is_registered_with_both_front_ends(family: Family) -> None:
    """Step 2: the row alone registers the family's names (wiring/registration.py) with the Trainer and with Fabric."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY
    from lightning.pytorch.strategies import StrategyRegistry

    for name in family.names:
        assert StrategyRegistry[name]["strategy"] is family.trainer
        assert STRATEGY_REGISTRY[name]["strategy"] is family.fabric


def test_the_vocabulary_tables_derive_from_the_rows() -> None:
    """policy's and activation's tables are the family table's: one table for every strategy name."""
    from lightning_anyaccel.wiring import activation, policy

    assert policy.EQUIVALENTS is families.EQUIVALENTS and policy.CLASS_EQUIVALENTS is families.CLASS_EQUIVALENTS
    assert activation.PROGRAM_STRATEGIES is families.PROGRAM_STRATEGIES
    registered = {name for family in FAMILIES for name in family.names}
    assert set(families.EQUIVALENTS.values()) <= registered
    assert set(families.CLASS_EQUIVALENTS) == {family.lightning_class for family in FAMILIES}
    assert families.START_METHODS == {"any_ddp": "popen", "any_ddp_spawn": "spawn", "any_ddp_fork": "fork",
                                      "any_ddp_notebook": "fork"}


def test_every_family_module_is_on_the_architecture_page() -> None:
    """Step 4: the module map names each family's module (its layer, `strategies/`, covers it)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert [f.name for f in FAMILIES if f"`strategies/{f.name}.py`" not in page] == []


def test_the_refusal_vocabulary_derives_from_the_rows() -> None:
    """Which families start several processes and which grid column each trains come from the rows, not a list."""
    from lightning_anyaccel.device.devices import DEVICE_TABLE
    from lightning_anyaccel.strategies.multi_process import AnyDistributedMixin

    assert families.MULTI_PROCESS_FAMILIES == tuple(f.name for f in FAMILIES if issubclass(f.trainer, AnyDistributedMixin))
    assert "single" not in families.MULTI_PROCESS_FAMILIES and "ddp" in families.MULTI_PROCESS_FAMILIES
    assert families.FEATURE_FAMILIES == {"ddp": "ddp", "fsdp": "fsdp", "fsdp2": "model_parallel", "deepspeed": "deepspeed"}
    no_backend = next(spec for spec in DEVICE_TABLE.values() if spec.backend is None)
    assert [f.name for f in FAMILIES if families.refusal(f.name, no_backend)] == list(families.MULTI_PROCESS_FAMILIES)
    # a new multi-process row is refused where the device has no backend without being listed anywhere else
    extra = dataclasses.replace(FAMILIES[1], name="ddp_copy", feature="ddp_copy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(families, "FAMILIES", (*FAMILIES, extra))
        assert families.refusal("ddp_copy", no_backend) is not None
        assert families.refusal("single", no_backend) is None
        with pytest.raises(ValueError, match="unknown strategy family 'made_up'.*ddp_copy"):
            families.refusal("made_up", no_backend)
