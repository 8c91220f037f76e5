"""Notebook 2 (single card) on the device under test, as a user runs it: nbmake in an empty folder.

On CPU the notebooks already run in JupyterLab and from the site's downloads (``tests/test_lab.py``,
``tests/test_site.py``); on another device (``--device emulated:acme`` in ``make test``: a device type
in no table and no code of the package) this shows that the tutorial trains there with no change
and no configuration: the notebook reports the device it trained on and the precision autocast used.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_anyaccel import get_spec

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_single_card.ipynb"


def _output_text(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
                     for cell in cells for out in cell.get("outputs", []))


@pytest.mark.device_generic
@pytest.mark.feature("single_device")
@pytest.mark.slow
def test_single_card_notebook_trains_on_the_device(device, python_runner, tmp_path):
    if device.is_cpu:
        pytest.skip("on CPU the notebooks run in JupyterLab and from the site (tests/test_lab.py, tests/test_site.py)")
    copy = tmp_path / NOTEBOOK.name
    shutil.copy(NOTEBOOK, copy)
    proc = python_runner(["-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--nbmake",
                          "--overwrite", copy.name], cwd=tmp_path, timeout=600)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]
    text = _output_text(copy)  # --overwrite kept the executed outputs
    assert f"device type: {device.type} " in text, text[-3000:]
    assert f"trained on {device.type}:0" in text, text[-3000:]
    if get_spec(device.type).supports_precision("bf16-mixed"):
        assert f"autocast device={device.type}, logits dtype inside autocast=torch.bfloat16" in text, text[-3000:]

