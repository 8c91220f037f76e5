"""The tests' import trimming (tests/lean_imports): what it turns off still exists, and only that changes."""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os

import pytest

import lean_imports
from conftest import AUTOLOAD, LEAN_IMPORTS, run_python

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_every_flag_it_turns_off_exists_in_the_installed_torchmetrics() -> None:
    """A torchmetrics that renames a flag would import scipy, transformers or matplotlib again."""
    imports = importlib.import_module("torchmetrics.utilities.imports")
    assert [name for name in lean_imports.FLAGS if not hasattr(imports, name)] == []
    assert all(getattr(imports, name) is False for name in lean_imports.FLAGS)  # this process has it installed


HEAVY = ("matplotlib", "scipy", "transformers", "rfc3987_syntax")
CHILD = f"""
import json, sys
import jsonschema, lightning_anyaccel, torch, torchmetrics
mean = torchmetrics.MeanMetric()
mean.update(torch.tensor([1.0, 3.0]))
checker = jsonschema.Draft7Validator.FORMAT_CHECKER
valid = [checker.conforms(value, fmt) for value, fmt in (("a@b.org", "email"), ("no email", "email"))]
print(json.dumps({{"heavy": sorted({set(HEAVY)!r} & set(sys.modules)), "mean": float(mean.compute()),
                  "formats_checked": valid, "device": str(torch.accelerator.current_accelerator())}}))
"""


def _child(env: dict[str, str]) -> dict[str, object]:
    done = run_python(["-c", CHILD], env=env, timeout=120)
    assert done.returncode == 0, done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_child_process_imports_lightning_and_torchmetrics_without_the_heavy_packages() -> None:
    # they are installed here (torchmetrics would import the first three without the trimming:
    # Lightning-AI/torchmetrics#3457; jsonschema the last); PathFinder: this process has the finder too
    assert all(importlib.machinery.PathFinder.find_spec(name) for name in HEAVY)
    out = _child({"PYTHONPATH": os.environ["PYTHONPATH"]})
    assert out["heavy"] == [] and out["mean"] == 2.0
    assert out["formats_checked"] == [True, False]  # jsonschema still checks the formats it has
    assert str(LEAN_IMPORTS) in os.environ["PYTHONPATH"].split(os.pathsep)


@pytest.mark.parametrize("first", ["lean", "emulator"])
def test_the_emulators_autoload_runs_whichever_sitecustomize_comes_first(first: str) -> None:
    """Python runs one ``sitecustomize``: each of the two runs the other's work too."""
    folders = [str(LEAN_IMPORTS), str(AUTOLOAD)] if first == "lean" else [str(AUTOLOAD), str(LEAN_IMPORTS)]
    out = _child({"PYTHONPATH": os.pathsep.join([*folders, os.environ["PYTHONPATH"]]),
                  "LIGHTNING_ANYACCEL_EMULATE": "acme"})
    assert out["device"] == "acme" and out["heavy"] == []
