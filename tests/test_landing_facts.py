"""The facts the README and the landing pages state about the repository, read from the repository.

- the notebooks: the numbered lists of README.md and docs/index.md are exactly ``notebooks/*.ipynb``, in
  order, and no count of notebooks in words ("five notebooks") is written anywhere a user reads first;
- the GPUs: every "NVIDIA <model>" these pages name is the device of a validation record (docs/records);
- the extras: the README's list of extras is pyproject.toml's, and every ``lightning-anyaccel[extra]``
  a page or notebook shows exists;
- AMD: no page or notebook names an AMD GPU or ROCm while no record ran on one ("AMD EPYC", the CPU
  of the CPU records, is a record's device name).

Each check fails on a made-up fact (the ``*_catches_*`` tests feed one in).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the docs extra installs tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: the pages a user reads first: their facts are checked here
LANDING = ["README.md", "docs/index.md", "docs/installation.md", "docs/quickstart.md"]
NUMBER_WORDS = "one two three four five six seven eight nine ten eleven twelve".split()


def _text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _notebook_text(stem: str) -> str:
    """The markdown and code of a notebook's cells (not its outputs)."""
    cells = json.loads(_text(f"notebooks/{stem}.ipynb"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells)


def _records() -> list[dict]:
    return [tomllib.loads(p.read_text()) for p in sorted((ROOT / "docs" / "records").rglob("*.toml"))]


# ----- notebooks ------------------------------------------------------------------------------------------

def readme_notebooks(text: str) -> list[str]:
    """The README's numbered list: ``1. `01_verify_environment` — ...``."""
    return re.findall(r"^\d+\. `(\d\d_\w+)`", text, flags=re.M)


def index_notebooks(text: str) -> list[str]:
    """The landing page's numbered list: ``1. [title](../notebooks/01_verify_environment.ipynb): ...``."""
    return re.findall(r"^\d+\. \[[^]]+\]\(\.\./notebooks/(\d\d_\w+)\.ipynb\)", text, flags=re.M)


def notebook_counts(text: str) -> list[str]:
    """Counts of notebooks written in words or digits ("five notebooks", "6 notebooks")."""
    words = "|".join(NUMBER_WORDS)
    return re.findall(rf"\b((?:{words}|\d+) (?:tutorial )?notebooks)\b", text, flags=re.I)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS


@pytest.mark.parametrize("page, listed", [("README.md", readme_notebooks), ("docs/index.md", index_notebooks)])
def test_the_pages_list_every_notebook_in_order(page, listed):
    missing = [n for n in NOTEBOOKS if n not in listed(_text(page))]
    assert listed(_text(page)) == NOTEBOOKS, (
        f"{page} lists {listed(_text(page))}, notebooks/ has {NOTEBOOKS}: add a line for each of {missing}"
        " (and drop the lines of notebooks that are gone)")


@pytest.mark.parametrize("page", LANDING)
def test_no_page_counts_the_notebooks_in_words(page):
    assert not notebook_counts(_text(page)), f"{page}: {notebook_counts(_text(page))}: say 'the notebooks' and list them"


def test_the_notebook_checks_catch_a_missing_line_and_a_count():
    readme = _text("README.md")
    first = re.search(r"^1\. `01_verify_environment`.*\n", readme, flags=re.M)
    assert first is not None
    assert readme_notebooks(readme.replace(first.group(0), "")) != NOTEBOOKS
    assert notebook_counts("Its tutorial is five notebooks in `notebooks/`") == ["five notebooks"]


# ----- GPU names ------------------------------------------------------------------------------------------

def gpu_names(text: str) -> set[str]:
    """Every "NVIDIA <model>" named (NVIDIA H200, NVIDIA A100, NVIDIA GH200 ...)."""
    return set(re.findall(r"\bNVIDIA [A-Z]+\d+\w*", text))


def test_every_gpu_named_is_a_records_device():
    devices = {str(r.get("device_name")) for r in _records()}
    for page in LANDING:
        unknown = gpu_names(_text(page)) - devices
        assert not unknown, f"{page} names {sorted(unknown)}; the records (docs/records) ran on {sorted(devices)}"


def test_the_gpu_check_catches_a_made_up_gpu():
    assert gpu_names("the run on one NVIDIA H100. About") == {"NVIDIA H100"}
    assert "NVIDIA H100" not in {str(r.get("device_name")) for r in _records()}


# ----- extras ---------------------------------------------------------------------------------------------

def _extras() -> set[str]:
    return set(tomllib.loads(_text("pyproject.toml"))["project"]["optional-dependencies"])


def readme_extras(text: str) -> set[str]:
    """The extras of the README's sentence "Extras: `[tutorial]` (...), ... the Makefile installs all of them"."""
    sentence = re.search(r"Extras: (.*?)the Makefile installs", text, flags=re.S)
    assert sentence, "README.md has no sentence 'Extras: ... the Makefile installs all of them'"
    return set(re.findall(r"`\[([\w-]+)\]`", sentence.group(1)))


def test_the_readme_lists_every_extra():
    assert readme_extras(_text("README.md")) == _extras()


def test_every_extra_shown_exists():
    shown = {(page, extra) for page in [*LANDING, *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
             for extra in re.findall(r"lightning-anyaccel\[([\w,-]+)\]", _text(page))}
    shown |= {(f"notebooks/{nb}.ipynb", extra) for nb in NOTEBOOKS
              for extra in re.findall(r"lightning-anyaccel\[([\w,-]+)\]", _notebook_text(nb))}
    unknown = {(page, extra) for page, extras in shown for extra in extras.split(",") if extra not in _extras()}
    assert not unknown, f"extras that pyproject.toml does not define: {sorted(unknown)}"


def test_the_extras_check_catches_a_missing_extra():
    assert readme_extras("Extras: `[test]` (pytest), `[docs]`; the Makefile installs all of them") != _extras()


# ----- AMD ------------------------------------------------------------------------------------------------

def amd_claims(text: str, records: list[dict]) -> list[str]:
    """The words naming AMD or ROCm that no record backs: any while no cuda record ran on an AMD GPU, except a
    record's own device name ("AMD EPYC", the CPU the CPU records ran on)."""
    if any(r.get("device_type") == "cuda" and "AMD" in str(r.get("device_name", "")) for r in records):
        return []
    names = {str(r.get("device_name")) for r in records if "AMD" in str(r.get("device_name", ""))}
    found = []
    for match in re.finditer(r"\bAMD\b[^\n]{0,30}|\bROCm\b", text):
        if not any(match.group(0).startswith(name) for name in names):
            found.append(match.group(0))
    return found


@pytest.mark.parametrize("page", [*LANDING, *(f"notebooks/{nb}.ipynb" for nb in NOTEBOOKS)])
def test_no_amd_gpu_is_named_without_a_rocm_record(page):
    text = _notebook_text(Path(page).stem) if page.endswith(".ipynb") else _text(page)
    assert not amd_claims(text, _records()), f"{page}: {amd_claims(text, _records())} (no ROCm record in docs/records)"


def test_the_amd_check_catches_a_claim_and_lets_the_cpu_name_pass():
    records = _records()
    assert amd_claims("runs on NVIDIA/AMD (`cuda`) GPUs", records) == ["AMD (`cuda`) GPUs"]
    assert amd_claims("32-true on 2 cores of an AMD EPYC. Before", records) == []
    assert amd_claims("the CUDA or ROCm build", records) == ["ROCm"]
