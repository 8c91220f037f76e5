"""The files that describe the project stay in step with each other and with the device table.

- ``environment.yml`` lists every dependency of ``pyproject.toml`` (package, ``test`` and ``docs``
  extras) with the same version range, and nothing else from pip;
- the README names the commands of the Makefile, the lightning range and the torch pin;
- ``docs/validation.toml`` (what was run where) covers every device type of ``DEVICE_TABLE``;
- the notebooks are committed without outputs, carry their nbmake/nbsphinx timeouts and contain
  no device-name branches (device knowledge comes from the device table);
- the launch scripts are valid bash; the lab kernel registers this interpreter;
- the Makefile's one-device pass collects every file with a ``one_device`` test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from lightning_anyaccel.device.devices import DEVICE_TABLE

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _norm(requirement: str) -> str:
    """``name[extras]>=1,<2; marker`` with names lower-cased, ``_``->``-`` and no spaces."""
    text = re.sub(r"\s+", "", requirement).replace('"', "'")
    match = re.match(r"([A-Za-z0-9_.\-]+)(.*)", text)
    assert match, requirement
    return match.group(1).lower().replace("_", "-") + match.group(2)


def _pyproject_requirements() -> list[str]:
    extras = PYPROJECT["project"].get("optional-dependencies", {})
    return [*PYPROJECT["project"]["dependencies"], *extras.get("test", []), *extras.get("docs", [])]


def _environment_pip_lines() -> list[str]:
    lines, in_pip = [], False
    for raw in (ROOT / "environment.yml").read_text().splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.strip().startswith("#") else ""
        if re.match(r"\s*-\s*pip:\s*$", line):
            in_pip = True
            continue
        if in_pip and re.match(r"\s+-\s+", line):
            lines.append(re.sub(r"^\s+-\s+", "", line).strip())
    return lines


def test_environment_yml_lists_every_pyproject_dependency():
    env = {_norm(line) for line in _environment_pip_lines() if not line.startswith("-e")}
    wanted = {_norm(req) for req in _pyproject_requirements()}
    assert wanted - env == set(), f"in pyproject.toml, missing from environment.yml: {sorted(wanted - env)}"
    assert env - wanted == set(), f"in environment.yml, not in pyproject.toml: {sorted(env - wanted)}"
    assert any(line.startswith("-e .") for line in _environment_pip_lines()), "environment.yml must install the package"


def test_torch_is_never_a_pip_dependency():
    names = [_norm(req).split(">")[0].split("=")[0].split("<")[0] for req in _pyproject_requirements()]
    assert "torch" not in names, "torch must not be a pip dependency: it would replace vendor builds"


def test_readme_names_the_commands_and_versions():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "docs", "lab"):
        assert re.search(rf"^{target}:", makefile, re.M), f"Makefile has no {target} target"
        assert f"make {target}" in readme, f"README does not mention `make {target}`"
    lightning = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("lightning"))
    assert lightning.replace(" ", "") in readme.replace(" ", ""), f"README should state {lightning}"
    torch_spec = re.search(r"^TORCH_SPEC \?= (\S+)", makefile, re.M).group(1)
    assert torch_spec in readme, f"README should name the torch the Makefile installs ({torch_spec})"


def test_make_test_runs_the_notebooks():
    makefile = (ROOT / "Makefile").read_text()

    def recipe(target: str) -> str:
        return re.search(rf"^{target}:.*?\n((?:\t.*\n)+)", makefile, re.M).group(1)

    assert "test-suite" in recipe("test").split()
    assert "pytest --nbmake notebooks/" in recipe("test-suite")


def test_validation_status_covers_every_device_type():
    """Every device type has its sentence; the levels a run proves come only from records (docs/records)."""
    data = tomllib.loads((ROOT / "docs" / "validation.toml").read_text())
    devices = data["devices"]
    assert set(DEVICE_TABLE) <= set(devices), f"no validation entry for {sorted(set(DEVICE_TABLE) - set(devices))}"
    for device_type, entry in devices.items():
        assert entry.get("what"), f"{device_type}: say what ran"
        assert not {"status", "hardware", "emulated", "date"} & set(entry), \
            f"{device_type}: status and levels come from the records in docs/records, never from this file"


def test_device_pages_facts_cover_every_device_type():
    """Every device type has its users' facts (docs/device_pages.toml, the device pages' source): the stack
    versions that work and fail, the vendor's install guide, an install block that bash parses, comparison
    rows with a known mark, each missing feature with what to do instead, and the launch recipe."""
    pages = tomllib.loads((ROOT / "docs" / "device_pages.toml").read_text())
    assert set(DEVICE_TABLE) <= set(pages), f"no device page facts for {sorted(set(DEVICE_TABLE) - set(pages))}"
    for device_type, facts in pages.items():
        for key in ("family", "stack_works", "stack_fails", "guide", "install", "rows", "gains", "launch"):
            assert facts.get(key), f"{device_type}: no {key}"
        assert facts["guide"][1].startswith("https://"), facts["guide"]
        proc = subprocess.run(["bash", "-n"], input=facts["install"], text=True, capture_output=True, timeout=30)
        assert proc.returncode == 0, f"{device_type}: the install block does not parse: {proc.stderr}"
        assert "<" not in facts["install"], f"{device_type}: a placeholder in the install block"
        for mark, feature, text in facts["rows"]:
            assert mark in ("yes", "differs", "no"), (device_type, mark)
            assert text.strip(), f"{device_type}: {feature}: say what to do"
    # the vendors' own plugins or recipes are compared where they exist
    assert {"hpu", "sdaa", "xpu"} <= {t for t, f in pages.items() if f.get("compare")}
    # AMD only once a ROCm device ran (docs/records)
    assert "AMD" not in pages["cuda"]["family"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebooks_are_clean_and_device_generic(path):
    book = json.loads(path.read_text())
    assert book["metadata"]["execution"]["timeout"] <= 600
    assert book["metadata"]["kernelspec"]["name"] == "python3"
    for cell in book["cells"]:
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs") and cell.get("execution_count") is None, \
            f"{path.name}: commit notebooks without outputs (the docs build and nbmake execute them)"
        source = "".join(cell["source"])
        types = "|".join(map(re.escape, DEVICE_TABLE))
        branch = re.search(rf"""(==|!=|\bin\b)\s*[\(\[{{]?\s*["']({types})["']""", source)
        assert not branch, f"{path.name}: branches on a device name ({branch.group(0)!r}); ask the device table"


#: Launch scripts the notebooks and docs show; the scale-out tests run them.
LAUNCH_SCRIPTS = ["env_vars.sh", "torchrun.sh", "slurm.sbatch", "mpiexec.sh", "aurora.pbs"]


def test_notebook_assets_exist():
    # the notebooks write their model, helpers and scripts themselves (tests/test_lab.py checks them)
    assert len(NOTEBOOKS) == 7, NOTEBOOKS
    for name in LAUNCH_SCRIPTS:
        assert (ROOT / "scripts" / "launch" / name).is_file(), name


@pytest.mark.parametrize("name", LAUNCH_SCRIPTS)
def test_launch_scripts_are_valid_bash(name):
    proc = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "launch" / name)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_lab_kernel_points_at_this_interpreter(tmp_path):
    pytest.importorskip("ipykernel")
    proc = subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(tmp_path),
                           "--name", "lightning-anyaccel"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "lightning-anyaccel" / "kernel.json").read_text())
    assert Path(spec["argv"][0]).resolve() == Path(sys.executable).resolve()


def test_every_error_links_its_troubleshooting_entry():
    """Each error class of the package ends its message with the address of its entry on the
    troubleshooting page: the hosted page of pyproject's Documentation URL, with the entry's label."""
    import lightning_anyaccel.strategies.errors  # noqa: F401  (defines NotebookLaunchError)
    from lightning_anyaccel.troubleshooting import TROUBLESHOOTING_URL, LinkedError

    docs = PYPROJECT["project"]["urls"]["Documentation"].rstrip("/")
    assert TROUBLESHOOTING_URL == f"{docs}/docs/troubleshooting.html"
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    classes = LinkedError.__subclasses__()
    assert len(classes) >= 13, classes
    for cls in classes:
        label = cls.__name__.lower()
        assert f"({label})=\n### " in page, f"no entry labelled ({label})= on docs/troubleshooting.md"
        message = str(cls("the message."))
        assert message == f"the message. (troubleshooting: {TROUBLESHOOTING_URL}#{label})", message


def test_architecture_module_map_matches_the_package():
    """docs/architecture.md's module map names every module of the package, and only those."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", page, flags=re.MULTILINE))
    package = ROOT / "src" / "lightning_anyaccel"
    modules = {path.relative_to(package).as_posix() for path in package.rglob("*.py")}
    assert mapped == modules, (
        f"docs/architecture.md's module map: missing {sorted(modules - mapped)}, not in the package {sorted(mapped - modules)}"
    )


def test_one_device_tests_are_in_the_one_device_pass():
    """Every test file with a ``one_device`` test is one of the Makefile's ``ONE_DEVICE_TESTS`` (the pass
    on the emulated accelerator loaded with one device collects only those files)."""
    listed = set(re.search(r"^ONE_DEVICE_TESTS \?= (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split())
    marked = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")
              if re.search(r"^@pytest\.mark\.one_device$", path.read_text(), re.M)}
    assert marked and marked <= listed, f"add {sorted(marked - listed)} to ONE_DEVICE_TESTS in the Makefile"
