"""Executed notebooks, kept so that the site does not run the notebooks a second time.

The test suite runs every notebook once (``tests/test_lab.py``, in JupyterLab) and stores the
executed copy under ``_build/executed-notebooks/`` with a hash of everything its outputs depend
on: the notebook's cells (which hold its model, helpers and scripts) and the package source. The
docs build (``conf.py``) uses a stored copy only while that hash still matches and
the copy ran every code cell without an error; otherwise nbsphinx executes the notebook itself.
So ``make docs`` after ``make test`` reuses the test run's notebooks, and ``make docs`` alone (or
after any edit) executes them. ``ANYACCEL_EXECUTE_NOTEBOOKS=always`` ignores the stored copies.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = ROOT / "_build" / "executed-notebooks"
#: files besides the notebook itself whose change invalidates every stored notebook
#: (the notebooks carry their helpers, model and scripts in their cells: those are hashed with the cells)
DEPENDENCIES = ["src/lightning_anyaccel"]
HASH_KEY = "anyaccel_source_hash"


def source_hash(notebook: Path) -> str:
    """SHA-256 of the notebook's cells (type and source, not outputs) and of its dependencies."""
    digest = hashlib.sha256()
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        digest.update(f"{cell['cell_type']}\0{source}\0".encode())
    for name in DEPENDENCIES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()
                                                     and "__pycache__" not in p.parts)
        for file in files:
            digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def problems(executed: dict[str, Any]) -> list[str]:
    """Why an executed notebook is not a complete, clean run (empty when it is)."""
    found = []
    for index, cell in enumerate(executed["cells"]):
        if cell["cell_type"] != "code" or not "".join(cell["source"]).strip():
            continue
        if cell.get("execution_count") is None:
            found.append(f"cell {index} did not run")
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output.get('ename')}: {output.get('evalue')}")
            elif output.get("output_type") == "stream" and output.get("name") == "stderr":
                # a warning box on the page: fix its cause, or explain it in the text
                text = "".join(output.get("text", ""))
                found.append(f"cell {index} wrote to stderr: {text.strip()[:300]}")
    return found


def normalize(executed: dict[str, Any]) -> dict[str, Any]:
    """A valid nbformat 4 notebook from JupyterLab's model (which writes ``"attachments": null``)."""
    import nbformat

    for cell in executed["cells"]:
        for key in [k for k, v in cell.items() if v is None and k != "execution_count"]:
            del cell[key]
    nbformat.validate(nbformat.from_dict(executed))  # raises on anything else nbformat would refuse
    return executed


def store(notebook: Path, executed: dict[str, Any]) -> Path:
    """Keep ``executed`` (nbformat JSON) as the executed copy of ``notebook``; refuse an incomplete run."""
    found = problems(executed)
    if found:
        raise ValueError(f"{notebook.name}: not stored, the run is incomplete: {found}")
    executed = normalize(executed)
    executed.setdefault("metadata", {})[HASH_KEY] = source_hash(notebook)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    target = CACHE_DIR / notebook.name
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(executed, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(target)
    return target


def fresh(notebook: Path) -> dict[str, Any] | None:
    """The stored executed copy of ``notebook`` if it matches the current sources, else None."""
    if os.environ.get("ANYACCEL_EXECUTE_NOTEBOOKS") == "always":
        return None
    target = CACHE_DIR / notebook.name
    if not target.is_file():
        return None
    try:
        executed = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if executed.get("metadata", {}).get(HASH_KEY) != source_hash(notebook) or problems(executed):
        return None
    return executed
