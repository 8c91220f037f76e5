"""The facts the README and the landing pages state about the repository, read from the repository.

- the notebooks: the numbered lists of README.md and docs/index.md are exactly ``notebooks/*.ipynb``, in
  order, and no count of notebooks in words ("five notebooks") is written anywhere a user reads first;
- the devices: every accelerator model a page, the README, the changelog or a notebook names (NVIDIA H100,
  an A100, MI300X, Max 1550, Gaudi 3, ...) is the device of a validation record (docs/records) or of a
  benchmark run (benchmarks/results), unless :data:`NOT_A_RUN` says why the words are no observation;
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


# ----- device models --------------------------------------------------------------------------------------

#: An accelerator's model: NVIDIA's (H100, A100, GH200, L40S ...), AMD's Instinct (MI300X), Intel's GPU Max
#: (Max 1550) and Gaudi (Gaudi 3), Huawei's Ascend (Ascend 910B).
DEVICE_MODEL = re.compile(r"\b(?:(?:GH|GB|H|A|B|L|V)\d{2,3}[A-Z]?|MI\d{3}[A-Z]?|Max \d{4}|Gaudi ?\d|Ascend ?910[A-Z]?)\b")

#: Words naming a model that report no run, and why.
NOT_A_RUN = {
    "answered as a Gaudi 2 would": "docs/evidence.md: what the emulated HPU answers lightning-habana's tests",
    "or for Gaudi 1": "docs/evidence.md: why lightning-habana's tests skipped themselves",
}

#: Every page a user reads, the README and the changelog (the site includes it); the notebooks separately.
#: docs/devices/ is generated from the records.
PAGES = ["README.md", "CHANGELOG.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                                         if "devices" not in p.relative_to(ROOT / "docs").parts)]


def device_models(text: str) -> set[str]:
    """Every accelerator model named (``H200``, ``MI300X``, ``Gaudi 3``), except in the words of :data:`NOT_A_RUN`."""
    for words in NOT_A_RUN:
        text = text.replace(words, "")
    return set(DEVICE_MODEL.findall(text))


def run_devices() -> set[str]:
    """The names of the devices the records and the benchmark results ran on."""
    names = {str(r.get("device_name")) for r in _records()}
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        names.add(str(json.loads(path.read_text()).get("meta", {}).get("device", {}).get("name")))
    return names


def unbacked_models(text: str, devices: set[str]) -> set[str]:
    """The models ``text`` names that no device of ``devices`` is (``H200`` is backed by ``NVIDIA H200``)."""
    return {model for model in device_models(text) if not any(re.search(rf"\b{model}\b", name) for name in devices)}


@pytest.mark.parametrize("page", [*PAGES, *(f"notebooks/{nb}.ipynb" for nb in NOTEBOOKS)])
def test_every_device_named_is_a_runs_device(page):
    text = _notebook_text(Path(page).stem) if page.endswith(".ipynb") else _text(page)
    devices = run_devices()
    unknown = unbacked_models(text, devices)
    assert not unknown, (f"{page} names {sorted(unknown)}; the records (docs/records) and benchmark results ran on"
                         f" {sorted(devices)}: say what the package does, or cite the vendor's page without a model")


def test_the_device_check_catches_a_made_up_device():
    devices = run_devices()
    assert unbacked_models("with torch 2.10 (seen on an H100; see #21567)", devices) == {"H100"}
    assert unbacked_models("on one NVIDIA H100, an A100 and an MI300X", devices) == {"H100", "A100", "MI300X"}
    assert unbacked_models("Intel's Max 1550, a Gaudi 3, an Ascend 910B", devices) == {"Max 1550", "Gaudi 3", "Ascend 910B"}
    assert unbacked_models("a Gaudi 1 here; answered as a Gaudi 2 would", devices) == {"Gaudi 1"}
    assert unbacked_models("E402, bf16, 16-mixed, PyTorch 2.11, ddp_spawn", devices) == set()
    assert "H200" in device_models("on one NVIDIA H200 (torch 2.11)") and not unbacked_models("one NVIDIA H200", devices)


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
