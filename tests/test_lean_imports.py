"""The tests' import trimming (tests/lean_imports): what it turns off still exists, and only that changes."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os

import pytest

from conftest import AUTOLOAD, LEAN_IMPORTS, run_python

import lean_imports

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_every_flag_it_turns_off_exists_in_the_installed_torchmetrics() -> None:
    """A torchmetrics that renames a flag would import scipy, transformers or matplotlib again."""
    imports = importlib.import_module("torchmetrics.utilities.imports")
    assert [name for name in lean_imports.FLAGS if not hasattr(imports, name)] == []
    assert all(getattr(imports, name) is False for name in lean_imports.FLAGS)  # this process has it installed


CHILD = """
import json, sys
import lightning_anyaccel, torch, torchmetrics
mean = torchmetrics.MeanMetric()
mean.update(torch.tensor([1.0, 3.0]))
print(json.dumps({"heavy": sorted({"scipy", "transformers", "matplotlib"} & set(sys.modules)),
                  "mean": float(mean.compute()), "device": str(torch.accelerator.current_accelerator())}))
"""


def _child(env: dict[str, str]) -> dict[str, object]:
    done = run_python(["-c", CHILD], env=env, timeout=120)
    assert done.returncode == 0, done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_child_process_imports_lightning_and_torchmetrics_without_the_heavy_packages() -> None:
    # they are installed here (torchmetrics would import them all without the trimming: Lightning-AI/torchmetrics#3457)
    assert all(importlib.util.find_spec(name) for name in ("matplotlib", "scipy", "transformers"))
    out = _child({"PYTHONPATH": os.environ["PYTHONPATH"]})
    assert out["heavy"] == [] and out["mean"] == 2.0
    assert str(LEAN_IMPORTS) in os.environ["PYTHONPATH"].split(os.pathsep)


@pytest.mark.parametrize("first", ["lean", "emulator"])
def test_the_emulators_autoload_runs_whichever_sitecustomize_comes_first(first: str) -> None:
    """Python runs one ``sitecustomize``: each of the two runs the other's work too."""
    folders = [str(LEAN_IMPORTS), str(AUTOLOAD)] if first == "lean" else [str(AUTOLOAD), str(LEAN_IMPORTS)]
    out = _child({"PYTHONPATH": os.pathsep.join([*folders, os.environ["PYTHONPATH"]]),
                  "LIGHTNING_ANYACCEL_EMULATE": "acme"})
    assert out["device"] == "acme" and out["heavy"] == []
