"""The files that describe the project stay in step with each other and with the device table.

- ``environment.yml`` lists every dependency of ``pyproject.toml`` (package, ``test`` and ``docs``
  extras) with the same version range, and nothing else from pip;
- the README names the commands of the Makefile, the lightning range and the torch pin;
- ``docs/validation.toml`` (what was run where) covers every device type of ``DEVICE_TABLE``;
- the notebooks are committed without outputs, carry their nbmake/nbsphinx timeouts and contain
  no device-name branches (device knowledge comes from the device table);
- the launch scripts are valid bash; the lab kernel registers this interpreter;
- the one-device pass (tests/device_passes.toml) collects every file with a ``one_device`` test.
"""

from __future__ import annotations

import functools
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
        for mark, feature, text, *family in facts["rows"]:
            assert mark in ("yes", "differs", "no"), (device_type, mark)
            assert text.strip(), f"{device_type}: {feature}: say what to do"
            assert family in ([], ["ddp"], ["fsdp"], ["model_parallel"], ["deepspeed"]), (device_type, feature, family)
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
    """Every test file with a ``one_device`` test is a file of pass ``acme-one-device`` (tests/device_passes.toml: the
    pass on the emulated accelerator loaded with one device collects only those files)."""
    import device_passes

    listed = set(device_passes.load()["acme-one-device"].files)
    marked = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").glob("test_*.py")
              if re.search(r"^@pytest\.mark\.one_device$", path.read_text(), re.M)}
    assert marked and marked <= listed, f"add {sorted(marked - listed)} to [pass.acme-one-device] files in tests/device_passes.toml"


# ---- every name a page shows exists; every page follows the code's decisions ---------------------

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
#: the pages that show names: the README, the documentation's pages, the notebooks (the device pages are rendered)
SHOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *NOTEBOOKS]
PACKAGE = ROOT / "src" / "lightning_anyaccel"
#: `python -m MODULE` / `python FILE` commands, the options they are given (up to the end of the command)
COMMAND = re.compile(r"python3? (?:-m (lightning_anyaccel(?:\.\w+)+)|(examples/\w+\.py))((?:[ \t]+[^\s`|;&)]+)*)")
#: the project's name, not a class
PRODUCT = "AnyAccel"
PYTEST = re.compile(r"\bpytest((?:[ \t]+[^\s`|;&)]+)*)")


def _page_text(path: Path) -> str:
    if path.suffix == ".ipynb":
        return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
    return path.read_text(encoding="utf-8")


def _shown_texts() -> dict[str, str]:
    """Every page users read, by name: the sources above and the generated device pages (support tokens filled)."""
    import device_front
    import device_pages
    import records_text

    validation = records_text.load_validation(ROOT).get("devices", {})
    texts = {path.relative_to(ROOT).as_posix(): device_pages.substitute_support(_page_text(path), validation)
             for path in SHOWN}
    texts.update({f"docs/devices/{t}.md": text for t, text in device_front.render_device_pages(ROOT).items()})
    return texts


def _package_names() -> set[str]:
    """Every class, function and module-level name the package's sources define."""
    import ast

    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _resolves(dotted: str) -> bool:
    """``lightning_anyaccel.a.b.C``: the longest importable module, then attributes."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _options_of(source: Path) -> set[str]:
    """The ``--options`` a command line file defines (quoted ``--x`` literals: argparse, pytest's addoption)."""
    return set(re.findall(r"""["'](--[\w-]+)["']""", source.read_text(encoding="utf-8")))


@functools.cache
def _pytest_options() -> set[str]:
    """pytest's own options and those of the repository's plugins and conftest files."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plugin = _options_of(PACKAGE / "kit" / "emulator" / "pytest_plugin.py")  # the package's plugin, loaded where it is asked for
    return set(re.findall(r"(--[\w-]+)", proc.stdout)) | plugin


def _command_source(module: str, script: str) -> Path:
    """The file that defines the command's options: a thin entry's (``lightning_anyaccel.verify``) is the
    module it imports ``main`` from (``lightning_anyaccel.kit.verify``)."""
    import ast

    if module:
        path = ROOT / "src" / Path(*module.split("."))
        path = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and any(a.name == "main" for a in node.names):
                return _command_source(node.module, "")
        return path
    return ROOT / script


def _options(rest: str) -> list[str]:
    """The ``--options`` of a command line, up to a ``--`` that starts another command (``emulate ... -- python``)."""
    return re.findall(r"(?<!\S)(--[\w-]+)", re.split(r"(?<!\S)--(?!\S)", rest)[0])


def unresolved(text: str, defined: set[str]) -> list[str]:
    """What ``text`` shows that the repository does not have: module paths and ``Any*`` names of the package,
    strategy names, ``LIGHTNING_ANYACCEL_*``/``ANYACCEL_*`` variables, launch scripts and examples, and the
    options of its commands."""
    from lightning_anyaccel.strategies.families import FAMILIES

    found = [name for name in re.findall(r"\blightning_anyaccel(?:\.[A-Za-z_]\w*)+", text) if not _resolves(name)]
    found += [name for name in re.findall(r"\bAny[A-Z]\w*", text) if name not in defined and name != PRODUCT]
    strategies = {name for family in FAMILIES for name in family.names}
    found += [name for name in re.findall(r"""[`"'](any_\w+)[`"']""", text) if name not in strategies]
    sources = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in
                        [*PACKAGE.rglob("*.py"), *(p for p in (ROOT / "tests").rglob("*.py") if p.name != Path(__file__).name),
                         ROOT / "conftest.py", ROOT / "conf.py",
                         ROOT / "Makefile", *(ROOT / "scripts").rglob("*.*"), *(ROOT / "docs" / "_ext").glob("*.py")])
    found += [name for name in set(re.findall(r"\b(?:LIGHTNING_ANYACCEL|ANYACCEL)_[A-Z0-9_]*[A-Z0-9]\b", text))
              if not re.search(rf"\b{name}\b", sources)]
    found += [path for path in re.findall(r"\b(?:scripts/launch|examples)/[\w.-]*\w", text) if not (ROOT / path).exists()]
    for module, script, rest in COMMAND.findall(text):
        source = _command_source(module, script)
        if not source.exists():
            found.append(module or script)
        elif "LightningCLI" not in source.read_text():  # LightningCLI's options are Lightning's (tests/test_programs.py)
            found += [f"{module or script} {opt}" for opt in _options(rest) if opt not in _options_of(source)]
    for rest in PYTEST.findall(text):
        found += [f"pytest {opt}" for opt in _options(rest) if opt not in _pytest_options()]
    return found


def test_every_name_a_page_shows_exists():
    """Classes, functions and module paths of the package, strategy names, environment variables and command
    options on the README, the documentation's pages, the generated device pages and the notebooks all exist."""
    defined = _package_names()
    problems = {page: sorted(set(names)) for page, text in _shown_texts().items() if (names := unresolved(text, defined))}
    assert not problems, problems
    # the check can fail: the npu page once offered a class the package never defined, and made-up options
    assert unresolved("`strategy=AnyFSDP2Strategy()`", defined) == ["AnyFSDP2Strategy"]
    made_up = ("`lightning_anyaccel.strategies.AnyNothing`, `strategy=\"any_fsdp3\"`, `LIGHTNING_ANYACCEL_NO_SUCH`,"
               " `python -m lightning_anyaccel.verify --no-such-option`, `python examples/train.py --num_gpus 2`,"
               " `scripts/launch/pbs.sh`")
    assert set(unresolved(made_up, defined)) == {
        "lightning_anyaccel.strategies.AnyNothing", "AnyNothing", "any_fsdp3", "LIGHTNING_ANYACCEL_NO_SUCH",
        "lightning_anyaccel.verify --no-such-option", "examples/train.py --num_gpus", "scripts/launch/pbs.sh"}, \
        unresolved(made_up, defined)


def test_pages_follow_the_codes_refusals():
    """Each device page's comparison row about a strategy, each grid mark of a strategy and the migration page's
    support sentences come from the code's decision (lightning_anyaccel.strategies.families.refusal)."""
    import device_front
    import device_pages
    import records_text

    from lightning_anyaccel.strategies.families import FEATURE_FAMILIES, refusal

    pages = device_pages.load_pages(ROOT)
    strategy_words = re.compile(r"\b(DDP|FSDP2?|DeepSpeed)\b")
    for device_type, spec in DEVICE_TABLE.items():
        for row in pages[device_type]["rows"]:
            if strategy_words.search(row[1]) and "checkpoint" not in row[1]:
                assert len(row) == 4, f"{device_type}: the row {row[1]!r} is about a strategy: name its family"
            mark, text = device_pages.row_mark(spec, row)
            assert (mark == "no") == bool(len(row) == 4 and refusal(row[3], spec)) or (len(row) == 3), (device_type, row)
        for feature, family in FEATURE_FAMILIES.items():
            assert (device_pages.feature_mark(spec, {}, feature) == "✗") == bool(refusal(family, spec)), (device_type, feature)
    rendered = device_front.render_device_pages(ROOT)
    assert "✗ DeepSpeed" in rendered["sdaa"] if refusal("deepspeed", DEVICE_TABLE["sdaa"]) else "⚠ DeepSpeed" in rendered["sdaa"]
    migration = _shown_texts()["docs/migration.md"]
    assert "{{" not in migration
    validation = records_text.load_validation(ROOT).get("devices", {})
    assert device_pages.support_sentence("deepspeed", DEVICE_TABLE["sdaa"], validation.get("sdaa", {})) in migration
    # the check can fail: a row that calls a strategy missing where the code runs it stops the build
    with pytest.raises(ValueError, match="says missing"):
        device_pages.row_mark(DEVICE_TABLE["cuda"], ["no", "DeepSpeed", "not here", "deepspeed"])


def test_device_pages_say_what_ran_and_how_to_use_several_nodes():
    """Each device page says in one line which stack was run here (the records' hardware, else none), has a
    several-nodes recipe where the device has collectives, and defines every variable its commands use."""
    import device_front

    provided = {"PBS_NODEFILE", "HOME", "NODE_RANK", "MASTER_ADDR"}  # set by the scheduler, the shell or the user
    for device_type, text in device_front.render_device_pages(ROOT).items():
        run_here = re.search(r"^- \*\*Run here:\*\* (.+)$", text, re.M)
        assert run_here, f"{device_type}: no 'Run here' line"
        if DEVICE_TABLE[device_type].backend:
            assert re.search(r"several nodes|num_nodes", text, re.I), f"{device_type}: no several-nodes recipe"
        for code in re.findall(r"```bash\n(.*?)```|`([^`\n]*\$[^`\n]*)`", text, re.S):
            snippet = code[0] or code[1]
            arithmetic = " ".join(re.findall(r"\$\(\((.*?)\)\)", snippet))  # $((NNODES * 12))
            used = (set(re.findall(r"\$\{?(\w+)", snippet)) | set(re.findall(r"\b([A-Za-z_]\w*)", arithmetic))) - provided
            undefined = {name for name in used if not re.search(rf"\b{name}=", snippet)}
            assert not undefined, f"{device_type}: {sorted(undefined)} used but not defined in {snippet!r}"
    hpu = device_front.render_device_pages(ROOT)["hpu"]
    assert "none of these stacks was run here" in hpu
