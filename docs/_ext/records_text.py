"""The validation records as the pages word them: read once, then one text per cell.

The records under ``docs/records/`` (each written by its run: ``lightning_anyaccel.kit.tools.records``) and
``docs/validation.toml`` give each device type its levels of evidence (:func:`load_validation`). Each
record's age is the number of commits to the code it covers since its commit (``git`` at build time;
"age unknown" without the history, as in a shallow clone); past
``lightning_anyaccel.kit.tools.records.STALE_AFTER`` it is marked stale (:func:`age_text`). The tables
(``support_tables``), the device pages (``device_front``) and the support sentences read these.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import device_pages
import vendor_suites

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The three levels of evidence, strongest first: a record ``docs/records/<type>-<level>.toml``
#: (lightning_anyaccel.kit.tools.records) for each.
LEVELS = tuple(device_pages.LEVEL_MARKS)


def load_records(srcdir: Path) -> dict[str, dict[str, Any]]:
    """Every record under ``docs/records`` by its path relative to it (``cpu-hardware``,
    ``torch-oldest/npu-emulated``), each with its ``_age`` (:func:`lightning_anyaccel.kit.tools.records.age`)."""
    from lightning_anyaccel.kit.tools import records

    found = {}
    root = srcdir / records.RECORD_DIR
    for path in sorted(root.rglob("*.toml")):
        if path.relative_to(srcdir) == vendor_suites.RECORD:  # not a device's record: its own directive shows it
            continue
        record = records.load(path)
        record["_age"] = _age(srcdir, str(record.get("commit", "")), tuple(map(str, record.get("covers", ()))))
        record["_path"] = path.relative_to(srcdir).as_posix()
        found[path.relative_to(root).with_suffix("").as_posix()] = record
    return found


@functools.cache
def _age(srcdir: Path, commit: str, covers: tuple[str, ...]) -> int | None:
    """:func:`lightning_anyaccel.kit.tools.records.age`, asked of git once per record and build: the pages read
    the records many times (every table, every device page) and the history does not change during a build."""
    from lightning_anyaccel.kit.tools import records

    return records.age({"commit": commit, "covers": list(covers)}, srcdir)


def load_validation(srcdir: Path) -> dict[str, Any]:
    """`docs/validation.toml` with each device type's records as its ``hardware``/``emulated`` levels and its
    ``status`` (the strongest level present); ``tested``: the main environment's CPU record, if any."""
    with open(srcdir / "docs" / "validation.toml", "rb") as handle:
        data = tomllib.load(handle)
    found = load_records(srcdir)
    devices = data.setdefault("devices", {})
    for name, record in found.items():
        if "/" not in name:  # the main environment's records; the range ends' are in folders
            entry, level = devices.setdefault(record["device_type"], {}), record["level"]
            if name != f"{record['device_type']}-{level}":  # a second run at that level (the kit beside the suite)
                entry.setdefault("more", {}).setdefault(level, []).append(record)
            else:
                entry[level] = record
    for entry in devices.values():
        entry["status"] = next((level for level in LEVELS if isinstance(entry.get(level), dict)), "untested")
    data["records"] = found
    return data


def age_text(record: dict[str, Any]) -> str:
    """``commit 1a2b3c4d5e, 3 commits to its code since`` (or ``stale: ...``, ``age unknown``)."""
    from lightning_anyaccel.kit.tools.records import STALE_AFTER

    commit = str(record.get("commit", "unknown"))
    text = f"commit {commit[:10]}" + ("" if record.get("tree_clean") else " with uncommitted changes")
    age = record.get("_age")
    if age is None:
        return f"{text}, age unknown (no git history of that commit where this site was built)"
    if age > STALE_AFTER:
        return f"{text}, stale: {age} commits to its code since (bound: {STALE_AFTER})"
    return f"{text}, {age} commit{'s' if age != 1 else ''} to its code since"


def is_stale(record: dict[str, Any]) -> bool:
    from lightning_anyaccel.kit.tools.records import STALE_AFTER

    return isinstance(record.get("_age"), int) and record["_age"] > STALE_AFTER


def where_text(record: dict[str, Any]) -> str:
    """``1 x NVIDIA H200, up to 1 process`` (hardware) or the emulated device's name and count."""
    if record.get("level") == "simulated":
        return str(record.get("device_name", "simulated"))
    processes = record.get("max_processes", 0)
    return (f"{record.get('device_count', '?')} x {record.get('device_name', record.get('device_type'))},"
            f" up to {processes} process{'es' if processes != 1 else ''}")


def _records_at(entry: dict[str, Any], level: str) -> list[dict[str, Any]]:
    """The records of a device type at ``level``: ``<type>-<level>.toml`` first, then any other run at that level
    (``<type>-<level>-kit.toml``: the validation kit's run beside the test suite's)."""
    first = entry.get(level)
    return [first, *entry.get("more", {}).get(level, [])] if isinstance(first, dict) else []


def level_text(entry: dict[str, Any], level: str) -> str:
    """One cell of the three-level table: the records at ``level`` (where, when, which code, what ran), or "no"."""
    found = _records_at(entry, level)
    return "; and ".join(_record_text(sub) for sub in found) if found else "no"


def _record_text(sub: dict[str, Any]) -> str:
    """One record: where, when, which code, what ran."""
    parts = [str(sub["date"])[:10], where_text(sub), age_text(sub)]
    parts += [f"{k} {sub[k]}" for k in ("torch", "lightning", "driver", "cuda_runtime", "collectives", "vendor_package")
              if sub.get(k)]
    parts.append(f"{sub['passed']} passed, {sub['failed']} failed, {sub['skipped']} skipped: `{sub['command']}`")
    if sub.get("failed_tests"):
        parts.append("failed: " + ", ".join(f"`{t}`" for t in sub["failed_tests"]))
    if sub.get("note"):
        parts.append(str(sub["note"]))
    parts.append(f"`{sub['_path']}`")
    return "; ".join(parts)


def feature_cell(entry: dict[str, Any], feature: str) -> str:
    """The strongest level at which ``feature`` passed: H (hardware), E (emulated), S (simulated), or -.

    A pass recorded as ``"passed (1 process)"`` (a machine with one device) keeps its qualifier, e.g.
    ``H (1 process)``, and a multi-process pass at a weaker level is shown next to it; so does a failure
    (``H failed``) and a stale record (``E stale``).
    """
    cells = []
    for level, mark in device_pages.LEVEL_MARKS.items():
        runs = [(str(r.get("features", {}).get(feature, "")), r) for r in _records_at(entry, level)]
        # the strongest result of the level's records: a pass, a pass with a qualifier, a failure
        value, sub = min(runs, key=lambda run: (run[0] != "passed", not run[0].startswith("passed"),
                                                run[0] != "failed"), default=("", None))
        if isinstance(sub, dict) and value and is_stale(sub):
            mark += " stale"
        if value == "passed":
            return ", ".join([*cells, mark])
        if value.startswith("passed ("):
            cells.append(mark + value[len("passed"):])
        elif value == "failed":
            cells.append(f"{mark} failed")
    return ", ".join(cells) or "-"
