"""No file we ship admits the compromised Lightning releases; the claimed range covers what was tested.

``lightning`` and ``pytorch-lightning`` 2.6.2 and 2.6.3 ran a credential stealer at import
(GHSA-w37p-236h-pfx3, Lightning-AI/pytorch-lightning#21691). They were pulled from PyPI, but caches
and mirrors keep them, so every requirement on one of these names, in every file that installs
something, must exclude them: ``pyproject.toml`` (dependencies and extras), ``environment.yml``,
``requirements/*.in`` and the hash locks ``requirements/*.lock``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
COMPROMISED = ("2.6.2", "2.6.3")
LIGHTNING_NAMES = {"lightning", "pytorch-lightning", "lightning-fabric"}
#: The ends of the range that `make test-compat` runs (see docs/installation.md).
TESTED = {"oldest": "2.5.6", "newest": "2.6.6"}
#: The torch ends of `make test-compat` (requirements/torch-<end>.in; the floor is _compat.MIN_TORCH).
TESTED_TORCH = {"torch-oldest": "2.8.0", "torch-newest": "2.15.0"}


def _pyproject() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(r for extra in project.get("optional-dependencies", {}).values() for r in extra)]


def _environment_yml(path: Path) -> list[str]:
    lines, in_pip = [], False
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].rstrip()
        if line.strip().startswith("#") or not line.strip():
            continue
        if re.match(r"\s*-\s*pip:\s*$", line):
            in_pip = True
            continue
        item = re.match(r"\s*-\s+(.*)$", line)
        if item and in_pip and not item.group(1).startswith("-"):
            lines.append(item.group(1).strip())
    return lines


def _requirements_file(path: Path) -> list[str]:
    """Requirement lines of a pip requirements file or hash lock (continuations joined, options dropped)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)
        line = re.sub(r"\s--hash=\S+", "", line).strip()
        if line and not line.startswith("-"):
            out.append(line)
    return out


def shipped_requirements() -> dict[str, list[str]]:
    """Every requirement line of every file that installs something, by file."""
    files: dict[str, list[str]] = {"pyproject.toml": _pyproject(), "environment.yml": _environment_yml(ROOT / "environment.yml")}
    for path in sorted((ROOT / "requirements").glob("*")):
        if path.suffix in {".in", ".txt", ".lock"}:
            files[f"requirements/{path.name}"] = _requirements_file(path)
    return files


def lightning_requirements() -> list[tuple[str, Requirement]]:
    found = []
    for where, lines in shipped_requirements().items():
        for line in lines:
            try:
                req = Requirement(line)
            except InvalidRequirement as err:
                raise AssertionError(f"{where}: cannot parse requirement {line!r}: {err}") from None
            if canonicalize_name(req.name) in LIGHTNING_NAMES:
                found.append((where, req))
    return found


@pytest.mark.parametrize("where, req", lightning_requirements(), ids=lambda x: str(x))
def test_no_requirement_admits_the_compromised_releases(where, req):
    admitted = [v for v in COMPROMISED if req.specifier.contains(v, prereleases=True)]
    assert not admitted, (
        f"{where}: `{req}` admits {req.name} {', '.join(admitted)} (compromised, GHSA-w37p-236h-pfx3);"
        f" add !=2.6.2,!=2.6.3 to the specifier"
    )


def test_the_checks_see_every_file_that_names_lightning():
    """The parser must find the Lightning requirements, or the test above would pass on nothing."""
    where = {w for w, _ in lightning_requirements()}
    assert {"pyproject.toml", "environment.yml", "requirements/dev.lock", "requirements/compat-oldest.lock"} <= where
    assert (ROOT / "requirements" / "dev.lock").exists()


def test_both_front_ends_are_constrained_in_the_package_metadata():
    """``lightning`` requires ``pytorch-lightning`` without a version: our metadata must bound it."""
    names = {canonicalize_name(Requirement(r).name): Requirement(r) for r in _pyproject()}
    for name in ("lightning", "pytorch-lightning"):
        assert name in names, f"pyproject.toml must constrain {name}"
        assert names[name].specifier == names["lightning"].specifier, "both front ends need the same range"


def test_the_claimed_range_admits_the_tested_ends_and_nothing_untested():
    spec = next(Requirement(r) for r in _pyproject() if Requirement(r).name == "lightning").specifier
    for end, version in TESTED.items():
        assert spec.contains(version), f"{end} tested release {version} is outside {spec}"
    oldest, newest = Version(TESTED["oldest"]), Version(TESTED["newest"])
    assert not spec.contains(f"{oldest.major}.{oldest.minor - 1}.99"), f"{spec} admits a minor older than tested"
    assert not spec.contains(f"{newest.major}.{newest.minor + 1}.0"), f"{spec} admits a minor newer than tested"


def test_the_locks_pin_the_tested_ends():
    pins = {}
    for where, req in lightning_requirements():
        if where.endswith(".lock"):
            (version,) = [s.version for s in req.specifier if s.operator == "=="]
            pins.setdefault(where, set()).add(version)
    assert pins["requirements/dev.lock"] == {TESTED["newest"]}
    assert pins["requirements/compat-oldest.lock"] == {TESTED["oldest"]}


def test_every_lock_entry_has_a_hash():
    for path in sorted((ROOT / "requirements").glob("*.lock")):
        text = re.sub(r"\\\n", " ", path.read_text())
        torch_end = path.stem in TESTED_TORCH  # the torch ends' locks pin torch itself; no other lock may
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                assert "--hash=sha256:" in line, f"{path.name}: no hash for {line.split()[0]}"
                if not torch_end:
                    assert not line.split()[0].lower().startswith("torch=="), f"{path.name}: torch must stay outside the lock"


def test_the_torch_ends_are_the_floor_and_the_documented_newest():
    """`make test-compat`'s torch ends lock the versions the docs name, and the oldest is the import-time floor."""
    from lightning_anyaccel import _compat

    for end, version in TESTED_TORCH.items():
        assert f"torch=={version}" in _requirements_file(ROOT / "requirements" / f"{end}.lock"), end
    assert tuple(int(p) for p in TESTED_TORCH["torch-oldest"].split(".")[:2]) == _compat.MIN_TORCH
    ran = tomllib.loads((ROOT / "docs" / "validation.toml").read_text())["torch"]
    page = (ROOT / "docs" / "evidence.md").read_text()  # the contributors' page of what ran where
    readme = (ROOT / "README.md").read_text()
    for version in TESTED_TORCH.values():
        assert any(v.split("+")[0] == version for v in ran), f"docs/validation.toml [torch] must list {version}"
    for version, run in ran.items():
        assert run.get("role") and run.get("refresh"), f"docs/validation.toml [torch.{version!r}]: its role and the command that writes its records"
        assert version in page, f"docs/evidence.md's tested versions must list torch {version}"
        assert version.split("+")[0] in readme, f"README.md's status must list torch {version}"


def test_the_checker_catches_an_open_range():
    """The specifier logic itself: an unbounded or plain range is caught."""
    for bad in ("lightning", "lightning>=2.5,<2.7", "pytorch-lightning>2.6"):
        assert any(Requirement(bad).specifier.contains(v) for v in COMPROMISED), bad
    assert not any(Requirement("lightning>=2.5,!=2.6.2,!=2.6.3,<2.7").specifier.contains(v) for v in COMPROMISED)


def test_the_install_page_and_readme_state_the_tested_versions():
    page = (ROOT / "docs" / "installation.md").read_text()
    evidence = (ROOT / "docs" / "evidence.md").read_text()  # how each end was tested: the contributors' page
    readme = (ROOT / "README.md").read_text()
    for version in TESTED.values():
        assert version in page, f"docs/installation.md must say that {version} is supported"
        assert version in evidence, f"docs/evidence.md must say that {version} was tested"
        assert version in readme, f"README.md must say that {version} was tested"
    assert re.search(r"## Tested versions\n\n.*ran on \d{4}-\d{2}-\d{2}", evidence, re.S), "the tested versions need a date"
    assert "GHSA-w37p-236h-pfx3" in page and "2.6.2 and 2.6.3" in page
    assert "after the first release" in readme and "after the first release" in page
