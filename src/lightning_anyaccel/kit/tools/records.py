"""Validation records: what ran where, written by the run itself, tied to the commit of the code.

A record is one TOML file (the committed ones: ``docs/records/<device type>-<level>.toml``) that a
run writes when it ends: ``pytest --validation-record PATH`` (``tests/validation_record.py``) or
the validation kit ``python -m lightning_anyaccel.validate`` (:mod:`lightning_anyaccel.validate`).
It says:

- where: the device type, the level (``hardware``: a real device, CPU included; ``emulated``: the
  emulated accelerator ``lightning_anyaccel.kit.emulator``; ``simulated``: torch's device API replaced with fakes),
  the device's name and count, the most processes a passing test trained with;
- what code: the commit, whether the tree had uncommitted changes, and the paths the run exercised
  (``covers``: the support matrix counts the commits to them since, :func:`age`);
- when and with what: the date, the command, torch, Lightning, Python and vendor versions;
- what happened: every test's outcome (and a skip's reason), the counts, and per feature of
  :data:`FEATURES` whether the tests credited with it passed;
- ``[parity]``, where the parity tests ran: per strategy, the largest relative differences N processes
  measured against one device and the tolerance met (:func:`parity_section`), with the provenance of the
  run that measured them (a parity-only run replaces this section alone, :func:`with_parity`).

Feature credit is explicit: a test names the features its pass proves (``@pytest.mark.feature(...)``
in the tests; the kit's checks name theirs), and only tests that passed count. Nothing in a record is
edited by hand: the ``digest`` line covers every line after it, and :func:`problems` recomputes the
counts and features from the per-test outcomes (``tests/test_records.py`` runs it on the committed
records).

Example:
    >>> tests = {"t::fit": Outcome("passed", ("single_device",)), "t::ddp": Outcome("passed", ("ddp",), 1),
    ...          "t::fork": Outcome("skipped", ("fork_safety",), reason="cuda may fork")}
    >>> summary = summarise(tests)
    >>> summary["features"], summary["passed"], summary["skipped"], summary["max_processes"]
    ({'single_device': 'passed', 'ddp': 'passed (1 process)'}, 2, 1, 1)
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_anyaccel.device.spec import DeviceSpec

#: The record format's version (a reader refuses a newer one).
FORMAT = 1

#: The support matrix's features: name -> what a pass of a test credited with it shows.
FEATURES: dict[str, str] = {
    "single_device": "a fit on one device learns, parameters and batches on the device",
    "mixed_precision": "bf16-mixed / 16-mixed: autocast for the device type, the device's GradScaler",
    "ddp": "DDP: gradients all-reduced over the device's collective backend",
    "fork_safety": "a fork after the device was initialised is refused before the children start",
    "fsdp": "FSDP: parameters sharded across processes on the device",
    "fsdp2": "FSDP2 (fully_shard): parameters sharded across processes on the device",
    "deepspeed": "DeepSpeed ZeRO through the package's strategy",
    "checkpoint": "checkpoints saved on the device and resumed",
    "device_stats": "DeviceStatsMonitor gets the device's memory statistics",
    "profiling": "Trainer(profiler=\"pytorch\") reports the device's own time per operator (the host's on CPU)",
    "verify": "python -m lightning_anyaccel.verify passes",
    "transformer": "a Hugging Face transformer (GPT-2) trains",
}

#: The levels a record can have: a real device (CPU included), the emulated accelerator of the tests, or torch's
#: device API replaced with fakes (the package's decisions checked, nothing ran on a device).
LEVELS = ("hardware", "emulated", "simulated")

#: A record is shown as stale once this many commits changed the code it covers
#: (``covers``) since the commit it ran on (docs/contributing.md, "Validation records").
STALE_AFTER = 20

#: Where the committed records live, relative to the repository root.
RECORD_DIR = Path("docs") / "records"

#: The commit of the code, where the run can not ask git (a copy of the tree without ``.git``):
#: ``<sha>`` for a clean tree, ``<sha>-dirty`` for one with uncommitted changes.
COMMIT_ENV = "LIGHTNING_ANYACCEL_COMMIT"

OUTCOMES = ("passed", "failed", "skipped")
_SHA = re.compile(r"[0-9a-f]{7,40}")


@dataclass(frozen=True)
class Outcome:
    """One test's (or check's) result.

    Attributes:
        outcome: ``"passed"``, ``"failed"`` or ``"skipped"``.
        features: the features of :data:`FEATURES` a pass of it proves.
        processes: how many processes it trained with (``None``: not a multi-process test).
        reason: why it was skipped (or the first line of its failure).
        parity: a parity check's largest relative differences and the tolerance they met (``tools/parity.py``).
    """

    outcome: str
    features: tuple[str, ...] = ()
    processes: int | None = None
    reason: str = ""
    parity: Mapping[str, float] | None = None


def check_features(names: Iterable[str], where: str) -> tuple[str, ...]:
    """``names`` as a tuple, every one a feature of :data:`FEATURES` (else a ``ValueError`` naming them)."""
    names = tuple(names)
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise ValueError(f"{where}: unknown feature(s) {unknown}; the features are {sorted(FEATURES)}"
                         " (lightning_anyaccel.kit.tools.records.FEATURES)")
    return names


def summarise(tests: Mapping[str, Outcome]) -> dict[str, Any]:
    """The counts, the failed tests, the most processes a passing test used, and each feature's result.

    A feature is ``"failed"`` if a test credited with it failed, else ``"passed"`` if one passed,
    qualified ``"passed (1 process)"`` when every passing test of it ran as one process (a
    multi-process strategy on a machine with one device). Skipped tests prove nothing.
    """
    counts = {k: sum(1 for t in tests.values() if t.outcome == k) for k in OUTCOMES}
    features: dict[str, str] = {}
    for feature in FEATURES:
        ran = [t for t in tests.values() if feature in t.features and t.outcome != "skipped"]
        if not ran:
            continue
        if any(t.outcome == "failed" for t in ran):
            features[feature] = "failed"
        elif all(t.processes == 1 for t in ran):
            features[feature] = "passed (1 process)"
        else:
            features[feature] = "passed"
    passed = [t.processes or 1 for t in tests.values() if t.outcome == "passed"]
    return {**counts, "failed_tests": sorted(n for n, t in tests.items() if t.outcome == "failed"),
            "max_processes": max(passed, default=0), "features": features}


# ---- parity: the largest differences N processes measured against one device ----------------------------

#: The numbers of one parity measurement (``parity_compare.ParityReport``): optimizer steps compared, the largest
#: relative differences of the global gradient norm, the gradients and the updates, and the tolerance met.
PARITY_KEYS = ("steps", "norm", "grad", "update", "rtol", "atol")
#: The provenance a ``[parity]`` section carries: the run that measured it, which may be younger than the record's.
PARITY_PROVENANCE = ("date", "commit", "tree_clean", "commit_source", "command", "torch", "lightning", "python",
                     "processes", "failed_tests")


def parity_section(strategies: Mapping[str, Mapping[str, float]], *, processes: int, command: str,
                   root: Path | None, failed_tests: Iterable[str] = (),
                   date: datetime.datetime | None = None) -> dict[str, Any]:
    """A record's ``[parity]`` section: per strategy the numbers of :data:`PARITY_KEYS`, with this run's provenance.

    ``processes``: how many processes each strategy ran with; ``failed_tests``: the parity tests of this run
    that failed (their strategies have no numbers).
    """
    for name, numbers in strategies.items():
        if set(numbers) != set(PARITY_KEYS):
            raise ValueError(f"parity of {name}: the keys are {sorted(numbers)}, not {list(PARITY_KEYS)}")
    when = (date or datetime.datetime.now(datetime.timezone.utc)).replace(microsecond=0)
    facts = software()
    return {"date": when, **provenance(root), "command": command,
            **{k: facts[k] for k in ("torch", "lightning", "python") if k in facts},
            "processes": processes, "failed_tests": sorted(failed_tests),
            "strategies": {name: {k: strategies[name][k] for k in PARITY_KEYS} for name in sorted(strategies)}}


def with_parity(text: str, section: Mapping[str, Any], device_type: str, level: str) -> dict[str, Any]:
    """The record ``text`` with its ``[parity]`` section replaced by ``section`` (a parity-only run's).

    The rest stays as its run wrote it; ``ValueError`` naming the fix where ``text`` is not a record a run wrote
    (:func:`problems`) or is another device type's or level's.
    """
    found = problems(text)
    if found:
        raise ValueError(f"the record is not what its run wrote ({'; '.join(found)}): write it again with"
                         " `make records` before adding parity to it")
    record = loads(text)
    if (record.get("device_type"), record.get("level")) != (device_type, level):
        raise ValueError(f"the record is {record.get('device_type')}-{record.get('level')}, this run measured"
                         f" {device_type}-{level}: give that device's record (docs/records/{device_type}-{level}.toml)")
    return {**{k: v for k, v in record.items() if k not in ("digest", "parity")}, "parity": dict(section)}


def parity_problems(section: Any) -> list[str]:
    """Why a ``[parity]`` section is not what a run measures (empty when it is): its keys, and every difference
    within its tolerance (a run writes a strategy's numbers only where they passed)."""
    if not isinstance(section, Mapping):
        return [f"parity is {type(section).__name__}, not a table"]
    found = [f"parity has no {key}" for key in (*PARITY_PROVENANCE, "strategies") if key not in section]
    for name, numbers in dict(section.get("strategies", {})).items():
        if not isinstance(numbers, Mapping) or set(numbers) != set(PARITY_KEYS):
            found.append(f"parity of {name}: not the keys {list(PARITY_KEYS)}")
        elif max(numbers["norm"], numbers["grad"], numbers["update"]) > numbers["rtol"]:
            found.append(f"parity of {name}: a difference above its tolerance rtol {numbers['rtol']:g}")
    return found


def largest_difference(numbers: Mapping[str, float]) -> float:
    """The largest relative difference of one parity measurement: the gradient norm, the gradients or the updates."""
    return max(float(numbers["norm"]), float(numbers["grad"]), float(numbers["update"]))


# ---- provenance: the commit, the versions, the device ------------------------------------------------


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def provenance(root: Path | None) -> dict[str, Any]:
    """The commit the code under ``root`` is at, and whether the tree was clean.

    In order: :data:`COMMIT_ENV` (a copy of the tree without git metadata), ``git`` in ``root``
    (changes under ``docs/records`` do not count: records are not code), the commit pip recorded when it
    installed the package from a git URL (PEP 610 ``direct_url.json``); else ``"unknown"``, which the
    support matrix shows as "age unknown". Never raises for a missing git.
    """
    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        sha = given.removesuffix("-dirty")
        if not _SHA.fullmatch(sha):
            raise ValueError(f"{COMMIT_ENV}={given!r}: give the commit's hash (`git rev-parse HEAD`), with"
                             " '-dirty' appended when the tree has uncommitted changes")
        return {"commit": sha, "tree_clean": not given.endswith("-dirty"), "commit_source": COMMIT_ENV}
    if root is not None and (root / ".git").exists():
        try:
            sha = _git(root, "rev-parse", "HEAD")
            changes = _git(root, "status", "--porcelain", "--", ".", f":(exclude){RECORD_DIR.as_posix()}")
            return {"commit": sha, "tree_clean": not changes, "commit_source": "git"}
        except (OSError, subprocess.SubprocessError):
            pass
    installed = _installed_commit()
    if installed:
        return {"commit": installed, "tree_clean": True, "commit_source": "pip (direct_url.json)"}
    return {"commit": "unknown", "tree_clean": False, "commit_source": "unknown"}


def _installed_commit() -> str | None:
    """The commit pip installed this package from (``pip install git+URL@REF``), if it did."""
    try:
        text = metadata.distribution("lightning-anyaccel").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    commit = json.loads(text).get("vcs_info", {}).get("commit_id")
    return str(commit) if commit else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software() -> dict[str, str]:
    """Python, platform, torch, the Lightning packages, the package and optional libraries, as installed."""
    import torch

    facts = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__}
    for dist in ("lightning", "pytorch-lightning", "lightning-anyaccel", "deepspeed", "transformers"):
        version = _version(dist)
        if version:
            facts[dist.replace("-", "_")] = version
    return facts


def _cpu_name() -> str:
    """The processor's model name (Linux's ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_facts(spec: DeviceSpec, *, emulated: bool = False) -> dict[str, Any]:
    """The device's name and count, and the runtime, driver and collective library versions torch reports."""
    import torch

    from lightning_anyaccel.device import runtime

    device_type = spec.type
    if spec.host:
        import psutil

        return {"device_name": _cpu_name(), "device_count": 1,
                "cpu_cores": os.cpu_count() or 0, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1)}
    module = runtime.device_module(spec)
    count = runtime.device_count(spec)
    get_name = getattr(module, "get_device_name", None)
    names = sorted({str(get_name(i)) for i in range(count)}) if callable(get_name) else [device_type]
    facts: dict[str, Any] = {"device_name": ", ".join(names) or device_type, "device_count": count}
    props = getattr(module, "get_device_properties", None)
    total = getattr(props(0), "total_memory", None) if callable(props) and count else None
    if total:
        facts["memory_gib"] = round(total / 2**30, 1)
    for attr in ("cuda", "hip", "xpu"):
        value = getattr(torch.version, attr, None)
        if value:
            facts[f"{attr}_runtime"] = str(value)
    for name, query in (("driver", getattr(module, "driver_version", None)),
                        ("collectives", getattr(getattr(module, "nccl", None), "version", None))):
        if callable(query):
            try:
                value = query()
                facts[name] = ".".join(map(str, value)) if isinstance(value, tuple) else str(value)
            except Exception:  # noqa: BLE001 - a vendor API without the query: leave it out
                pass
    if spec.vendor_module and not emulated:
        vendor = spec.vendor_module.split(".")[0]
        facts["vendor_package"] = f"{vendor} {_version(vendor.replace('_', '-')) or _version(vendor) or '?'}"
    return facts


def build_record(*, device_type: str, level: str, tests: Mapping[str, Outcome], command: str,
                 covers: Iterable[str], root: Path | None, runner: str, note: str = "",
                 date: datetime.datetime | None = None, facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A complete record (a dict in the order it is written), from the run's outcomes and this machine.

    ``facts`` replace what :func:`device_facts` asks torch about the device (a simulated device has none).
    """
    from lightning_anyaccel.device.devices import get_spec

    if level not in LEVELS:
        raise ValueError(f"level {level!r}: one of {LEVELS}")
    for name, test in tests.items():
        check_features(test.features, name)
    when = (date or datetime.datetime.now(datetime.timezone.utc)).replace(microsecond=0)
    summary = summarise(tests)
    record: dict[str, Any] = {
        "format": FORMAT, "device_type": device_type, "level": level,
        **(dict(facts) if facts is not None else device_facts(get_spec(device_type), emulated=level == "emulated")),
        "max_processes": summary.pop("max_processes"),
        "date": when, **provenance(root), "runner": runner, "command": command, "covers": sorted(set(covers)),
        **software(),
    }
    if note:
        record["note"] = note
    features = summary.pop("features")
    record.update(summary)
    record["features"] = features
    record["tests"] = {name: {"outcome": t.outcome, **({"features": list(t.features)} if t.features else {}),
                              **({"processes": t.processes} if t.processes else {}),
                              **({"reason": t.reason} if t.reason else {}), **({"parity": dict(t.parity)} if t.parity else {})}
                       for name, t in sorted(tests.items())}
    return record


# ---- the file: TOML written here (no writer in the standard library), read with tomllib ------------


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def toml_line(key: str, value: Any) -> str:
    """``key = value`` in TOML, as the records write it (for other run-written files: the vendor suites' record)."""
    return f"{_key(key)} = {_value(value)}"


def _body(record: Mapping[str, Any]) -> str:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in record.items()
             if k not in ("features", "tests", "digest", "parity")]
    lines += ["", "[features]", *(f"{_key(k)} = {_value(v)}" for k, v in record.get("features", {}).items())]
    lines += ["", "[tests]", *(f"{_key(k)} = {_value(v)}" for k, v in record.get("tests", {}).items())]
    if record.get("parity"):
        section = dict(record["parity"])
        lines += ["", "[parity]", *(f"{_key(k)} = {_value(v)}" for k, v in section.items() if k != "strategies")]
        lines += ["", "[parity.strategies]", *(f"{_key(k)} = {_value(v)}" for k, v in section["strategies"].items())]
    return "\n".join(lines) + "\n"


HEADER = ("# A validation record, written by the run it describes (lightning_anyaccel.kit.tools.records): never edit it by hand.\n"
          "# Refresh it by running `command` again (docs/contributing.md, \"Validation records\").\n")


def dumps(record: Mapping[str, Any]) -> str:
    """The record's text: the header, the ``digest`` of the body, the body."""
    body = _body(record)
    return HEADER + f'digest = "sha256:{hashlib.sha256(body.encode()).hexdigest()}"\n' + body


def write(path: Path, record: Mapping[str, Any]) -> None:
    """Write ``record`` to ``path`` at once or not at all (an interrupted run leaves no partial record)."""
    write_text(path, dumps(record))


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` at once or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(staged, path)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def loads(text: str) -> dict[str, Any]:
    """A record's fields (``tomllib``; ``tomli`` before Python 3.11)."""
    toml: Any = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return dict(toml.loads(text))


def load(path: Path) -> dict[str, Any]:
    """The record in ``path``."""
    return loads(path.read_text(encoding="utf-8"))


def problems(text: str) -> list[str]:
    """Why the record ``text`` is not what a run wrote (empty when it is).

    The digest must match the body, and the counts, failed tests and features must be what the
    per-test outcomes give (:func:`summarise`).
    """
    found = []
    match = re.search(r'^digest = "sha256:([0-9a-f]{64})"\n', text, re.M)
    if not match:
        return ["no digest line: not written by lightning_anyaccel.kit.tools.records"]
    if hashlib.sha256(text[match.end():].encode()).hexdigest() != match.group(1):
        found.append("the digest does not match: the record was edited after the run wrote it")
    record = loads(text)
    if record.get("format") != FORMAT:
        found.append(f"format {record.get('format')!r}, this reader knows {FORMAT}")
    try:
        tests = {name: Outcome(t["outcome"], check_features(t.get("features", ()), name), t.get("processes"),
                               t.get("reason", ""))
                 for name, t in record.get("tests", {}).items()}
    except (KeyError, TypeError, ValueError) as err:
        return [*found, f"a test entry is malformed: {err}"]
    summary = summarise(tests)
    for key, value in summary.items():
        if record.get(key) != value:
            found.append(f"{key} = {record.get(key)!r}, but its tests give {value!r}")
    if record.get("level") not in LEVELS:
        found.append(f"level {record.get('level')!r}: one of {LEVELS}")
    if "parity" in record:
        found += parity_problems(record["parity"])
    return found


# ---- age: commits to the covered code since the record's commit --------------------------------------


def age(record: Mapping[str, Any], root: Path) -> int | None:
    """How many commits changed the code the record covers since its commit; ``None`` if git can not tell.

    ``None`` where ``root`` has no git history, the commit is not in it (a shallow clone, as Read the
    Docs makes) or the record names no commit.
    """
    commit = str(record.get("commit", ""))
    if not _SHA.fullmatch(commit) or not (root / ".git").exists():
        return None
    covers = [str(p) for p in record.get("covers", ())] or ["."]
    try:
        _git(root, "cat-file", "-e", f"{commit}^{{commit}}")
        return int(_git(root, "rev-list", "--count", f"{commit}..HEAD", "--", *covers))
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
