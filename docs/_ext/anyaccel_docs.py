"""Sphinx extension of the lightning-anyaccel documentation.

- `anyaccel-support-matrix`, `anyaccel-install-table`, `anyaccel-validation`: directives
  that build their tables at build time from `lightning_anyaccel.device.devices.DEVICE_TABLE`, the
  validation records `docs/records/` (each written by its run: `lightning_anyaccel.kit.tools.records`) and
  `docs/validation.toml`, so the pages can not drift from the code or from what was run. Each
  record's age is the number of commits to the code it covers since its commit (`git` at build
  time; "age unknown" without the history, as in a shallow clone); past
  `lightning_anyaccel.kit.tools.records.STALE_AFTER` it is marked stale.
- `anyaccel-device-status`: the front page's status badge per device family, linking to the
  per-device pages `docs/devices/<type>.md`, which `write_device_pages` generates (install, the lines
  to change, `verify`, what ran, known limitations there) before Sphinx reads the sources.
- `{{repository}}` and `{{version}}` in the pages become `pyproject.toml`'s repository URL and the
  package version (one source for both, also inside code blocks).
- The site's entry point `index.html` redirects to the start page `docs/index.html`.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import device_pages
import vendor_suites
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The device families of the front page, in its order: device type -> (family, vendor words that
#: name it in docs/limitations.md, besides the device type itself).
FAMILIES = {
    "xpu": ("Intel GPU", ["XPU", "Intel GPU"]),
    "hpu": ("Intel Gaudi", ["HPU", "Gaudi", "habana"]),
    "npu": ("Huawei Ascend", ["NPU", "Ascend", "torch_npu"]),
    "sdaa": ("Teco", ["SDAA", "Teco", "torch_sdaa"]),
    "mlu": ("Cambricon", ["MLU", "Cambricon", "torch_mlu"]),
    "musa": ("Moore Threads", ["MUSA", "Moore Threads", "torch_musa"]),
    "cuda": ("NVIDIA / AMD GPU", ["CUDA", "ROCm", "NVIDIA"]),
    "mps": ("Apple GPU", ["MPS", "Apple"]),
    "cpu": ("CPU", []),
}

#: Sections of docs/migration.md for users of a vendor plugin (device type -> heading anchor).
MIGRATION = {
    "hpu": ("lightning-habana", "from-lightning-habana-gaudi-hpu"),
    "sdaa": ("lightning-teco", "from-lightning-teco-sdaa-sdaa"),
    "xpu": ("the Intel Aurora example", "from-the-intel-aurora-example-xpu-mpiexec"),
    "cuda": ("Lightning's `accelerator=\"gpu\"`", "from-lightnings-built-in-accelerators-acceleratorgpu"),
    "mps": ("Lightning's `accelerator=\"mps\"`", "from-lightnings-built-in-accelerators-acceleratorgpu"),
}

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
        record["_age"] = records.age(record, srcdir)
        record["_path"] = path.relative_to(srcdir).as_posix()
        found[path.relative_to(root).with_suffix("").as_posix()] = record
    return found


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


def _inline(text: Any) -> nodes.paragraph:
    """A paragraph from `text`; parts between backticks become inline code."""
    para = nodes.paragraph()
    for i, part in enumerate(str(text).replace("\n", " ").split("`")):
        if part:
            para += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    return para


def _table(header: list[str], rows: list[list[Any]], widths: list[int] | None = None,
           classes: list[str] | None = None) -> nodes.table:
    """A docutils table (works the same in MyST and reST pages)."""
    table = nodes.table(classes=["colwidths-given" if widths else "colwidths-auto", *(classes or [])])
    group = nodes.tgroup(cols=len(header))
    table += group
    for width in widths or [1] * len(header):
        group += nodes.colspec(colwidth=width)
    head, body = nodes.thead(), nodes.tbody()
    for section, content in ((head, [header]), (body, rows)):
        for values in content:
            row = nodes.row()
            for value in values:
                entry = nodes.entry()
                entry += _inline(value)
                row += entry
            section += row
    group += head
    group += body
    return table


def _records_at(entry: dict[str, Any], level: str) -> list[dict[str, Any]]:
    """The records of a device type at ``level``: ``<type>-<level>.toml`` first, then any other run at that level
    (``<type>-<level>-kit.toml``: the validation kit's run beside the test suite's)."""
    first = entry.get(level)
    return [first, *entry.get("more", {}).get(level, [])] if isinstance(first, dict) else []


def _level_text(entry: dict[str, Any], level: str) -> str:
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


def _feature_cell(entry: dict[str, Any], feature: str) -> str:
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


class _TableDirective(SphinxDirective):
    has_content = False

    def tables(self) -> list[nodes.table]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        # rebuild this page whenever the table's sources change
        self.env.note_dependency(str(Path(self.env.srcdir) / "docs" / "validation.toml"))
        for path in sorted((Path(self.env.srcdir) / "docs" / "records").rglob("*.toml")):
            self.env.note_dependency(str(path))
        import lightning_anyaccel.device.devices as devices

        self.env.note_dependency(devices.__file__)
        return list(self.tables())


class SupportMatrix(_TableDirective):
    """Every device type of the device table: names, backend, precisions, behaviour, status."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE
        from lightning_anyaccel.device.spec import PRECISION_DTYPES

        validation = load_validation(Path(self.env.srcdir)).get("devices", {})
        pages = device_pages.load_pages(Path(self.env.srcdir))
        rows = []
        for spec in DEVICE_TABLE.values():
            trainer_name = (f'`AnyAccelerator("{spec.type}")`' if spec.lightning_builtin
                            else f'`"{spec.type}"`')
            mixed = [f"`{flag}`" for flag in PRECISION_DTYPES if spec.supports_precision(flag)]
            rows.append([
                f"{device_pages.family_name(spec.type, pages, spec.name)} `{spec.type}`",
                trainer_name,
                f"`{spec.backend}`" if spec.backend else "none: one device only",
                ", ".join(mixed) or "none",
                "safe" if spec.fork_safe_after_init else "unsafe: use popen/spawn",
                device_pages.badge_text(validation.get(spec.type, {})),
            ])
        header = ["device", "Trainer(accelerator=...)", "collective backend", "mixed precision",
                  "fork after device init", "strongest run"]
        return [_table(header, rows, classes=["anyaccel-support-matrix"])]


class SupportGrid(_TableDirective):
    """Device types x features, one mark per cell: the strongest level of evidence (docs/_ext/device_pages.py)."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        srcdir = Path(self.env.srcdir)
        self.env.note_dependency(str(srcdir / "docs" / "device_pages.toml"))
        validation = load_validation(srcdir).get("devices", {})
        pages = device_pages.load_pages(srcdir)
        rows = []
        for spec in DEVICE_TABLE.values():
            entry = validation.get(spec.type, {})
            family = device_pages.family_name(spec.type, pages, spec.name)
            rows.append([f"{family} `{spec.type}`",
                         *(device_pages.feature_mark(spec, entry, f) for f in device_pages.GRID_FEATURES),
                         device_pages.parity_mark(spec, entry)])
        return [_table(["device", *(device_pages.FEATURES[f] for f in device_pages.GRID_FEATURES), "same as 1 device"], rows,
                       classes=["anyaccel-grid"])]


def _rank_device(spec: Any) -> str:
    """The "device of each rank" cell: ``<type>:LOCAL_RANK``, or one card per process seen as ``<type>:0``."""
    if spec.process_device_env:
        return f"one card per process, as `{spec.type}:0`; cards chosen by `{spec.process_device_env}`"
    return f"`{spec.type}:LOCAL_RANK`" if spec.backend and spec.type != "cpu" else "-"


class DeviceDetails(_TableDirective):
    """Per device type: vendor package, memory statistics, seeding, profiler, notes."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        rows = []
        for spec in DEVICE_TABLE.values():
            vendor = f"`{spec.vendor_module}`" if spec.vendor_module else "stock PyTorch"
            if spec.backend_module:
                vendor += f" (backend: `{spec.backend_module}`)"
            rows.append([
                f"`{spec.type}`",
                vendor,
                "PrivateUse1" if spec.private_use1 else "built into torch",
                spec.memory_stats,
                "yes" if spec.seeded_by_torch else "no: seeded through the device module",
                spec.profiler_activity or "-",
                _rank_device(spec),
                spec.notes or "-",
            ])
        header = ["device type", "registered by", "device kind", "memory statistics from", "seeded by torch.manual_seed",
                  "profiler activity", "device of each rank", "notes"]
        return [_table(header, rows)]


class InstallTable(_TableDirective):
    """Per device type: which PyTorch to install first, and the vendor package to import."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        rows = []
        for spec in DEVICE_TABLE.values():
            rows.append([
                f"`{spec.type}`",
                spec.name,
                spec.install.replace("`", "") if spec.install else "-",
                f"`import {spec.vendor_module}`" if spec.vendor_module else "nothing extra",
                f"`python -m lightning_anyaccel.verify --device {spec.type}`",
            ])
        header = ["device type", "hardware", "1. install this PyTorch first", "vendor package (imported for you)",
                  "3. check"]
        return [_table(header, rows, widths=[8, 18, 38, 18, 18])]


def _range_rows(data: dict[str, Any]) -> list[list[Any]]:
    """One row per end of the supported torch and Lightning ranges: its records, or that it must be refreshed."""
    rows = []
    for package in ("torch", "lightning"):
        for version, end in data.get(package, {}).items():
            prefix = f"{end['end']}/" if end.get("end") else ""
            found = {name: r for name, r in data["records"].items()
                     if name.startswith(prefix) and (prefix or "/" not in name)}
            if found and not prefix:  # the main environment: the device records of the tables below
                ran = "the records of the tables below: " + ", ".join(f"`{name}`" for name in found)
            elif found:
                ran = "; ".join(f"`{name}`: {str(r['date'])[:10]}, {age_text(r)}, {r['passed']} passed,"
                                f" {r['failed']} failed, {r['skipped']} skipped" for name, r in found.items())
            else:
                ran = f"no record: must be refreshed with `{end['refresh']}`"
            rows.append([f"{package} {version}", end.get("role", ""), ran])
    return rows


class ValidationTable(_TableDirective):
    """The ends of the supported ranges and, per device type, what ran where, from the records."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        data = load_validation(Path(self.env.srcdir))
        devices = data.get("devices", {})
        rows = [[f"`{t}`", *(_level_text(devices.get(t, {}), level) for level in LEVELS)] for t in DEVICE_TABLE]
        features = [[f"`{t}`", *(_feature_cell(devices.get(t, {}), f) for f in device_pages.FEATURES)] for t in DEVICE_TABLE]
        return [_table(["version", "role", "records"], _range_rows(data), widths=[16, 34, 50]),
                _table(["device type", *(device_pages.LEVEL_WORDS[level] for level in LEVELS)], rows,
                       widths=[10, 30, 30, 30]),
                _table(["device type", *device_pages.FEATURES.values()], features)]



class ParityTable(_TableDirective):
    """Per record with parity: who measured it (the run's date, commit, torch, command), what, and how far off."""

    def tables(self) -> list[nodes.Node]:
        from lightning_anyaccel.kit.tools import records

        srcdir = Path(self.env.srcdir)
        rows = []
        for name, record in load_records(srcdir).items():
            section = record.get("parity") or {}
            kit = {test_id: test["parity"] for test_id, test in record.get("tests", {}).items() if test.get("parity")}
            if section:
                found = ", ".join(f"{strategy} {records.largest_difference(numbers):.1e}"
                                  for strategy, numbers in section["strategies"].items())
                failed = "; failed: " + ", ".join(f"`{t}`" for t in section["failed_tests"]) if section["failed_tests"] else ""
                # its age: the commits to the code the record covers since the commit of the run that measured it
                measured = {**section, "_age": records.age({**section, "covers": record.get("covers", [])}, srcdir)}
                rows.append([f"`{name}`", f"{str(section['date'])[:10]}, {age_text(measured)},"
                             f" torch {section.get('torch', '?')}: `{section['command']}`",
                             f"{section['processes']} processes: {found}{failed}"])
            if kit:
                found = ", ".join(f"{test_id.removeprefix('validate::')} {records.largest_difference(numbers):.1e}"
                                  for test_id, numbers in kit.items())
                rows.append([f"`{name}`", f"{str(record['date'])[:10]}, {age_text(record)},"
                             f" torch {record.get('torch', '?')}: `{record['command']}`", f"the kit's checks: {found}"])
        if not rows:
            return [_inline("No record carries parity yet.")]
        return [_table(["record", "measured by", "largest relative difference per strategy"], rows,
                       widths=[16, 44, 40])]


# ---- the front door: status per device family, one generated page per device type -------------

#: where the generated per-device pages go (relative to the source directory); not committed
DEVICE_PAGES = Path("docs") / "devices"


def _slug(title: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``): lower case, words joined by ``-``."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _limitations_for(text: str, device_type: str, words: list[str]) -> list[tuple[str, str, str]]:
    """(section title, its anchor, the item's bold lead) of every item of ``limitations.md`` naming the device."""
    found, section = [], ""
    pattern = re.compile("|".join([rf"`{re.escape(device_type)}`", *(rf"\b{re.escape(w)}\b" for w in words)]))
    for block in re.split(r"\n\s*\n", text):
        heading = re.match(r"## (.+)", block)
        if heading:
            section = heading.group(1).strip()
            continue
        lead = re.match(r"\*\*(.+?)\*\*", block, re.S)
        if section and lead and pattern.search(block):
            found.append((section, _slug(section), " ".join(lead.group(1).split())))
    return found


def _trainer_lines(spec: Any) -> str:
    """The lines a user of this device type changes: the import and the Trainer's arguments.

    A device type Lightning has no accelerator for is found by ``Trainer()`` once the package is
    imported (``lightning_anyaccel.wiring.auto``); CPU, CUDA and MPS keep Lightning's own automatic choice,
    so their lines name the package's accelerator.
    """
    precision = next((flag for flag in ("bf16-mixed", "16-mixed") if spec.supports_precision(flag)), "32-true")
    if not spec.lightning_builtin:
        devices = f"all of them; DDP over {spec.backend} for several" if spec.backend else "one device"
        return "\n".join([
            "from lightning import Trainer",
            f"import lightning_anyaccel  # from now on, Trainer() finds the {spec.type} devices",
            "",
            f'trainer = Trainer(precision="{precision}")  # {devices}',
            f'trainer = Trainer(accelerator="{spec.type}", precision="{precision}")  # the same, by name',
        ])
    lines = ["from lightning import Trainer",
             "from lightning_anyaccel import AnyAccelerator  # also registers the strategy names", ""]
    accelerator = f'AnyAccelerator("{spec.type}")'
    if spec.backend:
        lines.append(f"trainer = Trainer(accelerator={accelerator}, devices=\"auto\", strategy=\"any_ddp\",")
    else:
        lines.append(f"trainer = Trainer(accelerator={accelerator}, devices=1, strategy=\"any_single\",")
    lines.append(f'                  precision="{precision}")')
    return "\n".join(lines)


def render_device_pages(srcdir: Path) -> dict[str, str]:
    """The text of ``docs/devices/<type>.md`` for every device type, by device type (also read by the tests)."""
    from lightning_anyaccel.device.devices import DEVICE_TABLE

    validation = load_validation(srcdir).get("devices", {})
    pages = device_pages.load_pages(srcdir)
    limitations = (srcdir / "docs" / "limitations.md").read_text(encoding="utf-8")
    rendered = {}
    for spec in DEVICE_TABLE.values():
        words = FAMILIES.get(spec.type, (spec.name, []))[1]
        facts = {"family": spec.name, "stack_works": "PyTorch 2.8 and newer", "guide": ["pytorch.org", "https://pytorch.org"],
                 "stack_fails": "PyTorch 2.7 and older", "install": 'pip install "git+{{repository}}.git"',
                 **pages.get(spec.type, {})}
        rendered[spec.type] = device_pages.device_page(spec, validation.get(spec.type, {}), facts, _trainer_lines(spec),
                                                       MIGRATION.get(spec.type),
                                                       _limitations_for(limitations, spec.type, words))
    return rendered


def write_device_pages(app: Sphinx) -> None:
    """Write ``docs/devices/<type>.md`` for every device type (only files whose text changed)."""
    out = Path(app.srcdir) / DEVICE_PAGES
    out.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for device_type, text in render_device_pages(Path(app.srcdir)).items():
        path = out / f"{device_type}.md"
        wanted.add(path.name)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    for stale in out.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()


class DeviceStatus(_TableDirective):
    """Per device family: a status badge linking to its generated page (the front page)."""

    def tables(self) -> list[nodes.Node]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        validation = load_validation(Path(self.env.srcdir)).get("devices", {})
        pages = device_pages.load_pages(Path(self.env.srcdir))
        here = Path(self.env.docname).parent
        items = []
        order = [t for t in FAMILIES if t in DEVICE_TABLE] + [t for t in DEVICE_TABLE if t not in FAMILIES]
        for device_type in order:
            family = device_pages.family_name(device_type, pages, DEVICE_TABLE[device_type].name)
            entry = validation.get(device_type, {})
            status = entry.get("status", "untested")
            stale = device_pages.badge_text(entry)
            target = Path(os.path.relpath(DEVICE_PAGES / f"{device_type}.html", here)).as_posix()
            items.append(
                f'<li><a class="anyaccel-device" href="{target}"><span class="anyaccel-family">{family}</span> '
                f"<code>{device_type}</code> "
                f'<span class="anyaccel-badge anyaccel-badge-{status}">{stale}</span></a></li>')
        html = '<ul class="anyaccel-device-status">\n' + "\n".join(items) + "\n</ul>\n"
        return [nodes.raw("", html, format="html")]


class BenchmarkSummary(SphinxDirective):
    """One sentence per device from ``benchmarks/results/<type>.json``: what the plugin costs over Lightning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        import json

        results = sorted((Path(self.env.srcdir) / "benchmarks" / "results").glob("*.json"))
        items = nodes.bullet_list()
        for path in results:
            self.env.note_dependency(str(path))
            doc = json.loads(path.read_text(encoding="utf-8"))
            sentence = _benchmark_sentence(doc, path.stem)
            if sentence:
                item = nodes.list_item()
                item += _inline(sentence)
                items += item
        return [items] if len(items) else [_inline("No benchmark results in `benchmarks/results/` yet.")]


def _benchmark_sentence(doc: dict[str, Any], device_type: str) -> str:
    """``cuda`` (NVIDIA H200, 2026-11-26): one device 1.01 x Lightning's own accelerator ..., GPT-2 1.00 x ..."""
    meta, overhead = doc.get("meta", {}), doc.get("overhead", {})
    ratio = overhead.get("ratios", {}).get("plugin/builtin", {}).get("per_round")
    if not ratio:
        return ""
    device = meta.get("device", {})
    where = f"`{device_type}` ({device.get('name', device_type)}, {str(meta.get('date', ''))[:10]})"
    parts = [f"{where}: on one device the plugin ran at {ratio['median']:.2f} x the steps per second of "
             f"Lightning's own accelerator (median of {ratio['n']} rounds; single rounds "
             f"{ratio['min']:.2f}-{ratio['max']:.2f})"]
    calls = overhead.get("calls_per_step", {})
    if calls.get("plugin") and calls.get("plugin") == calls.get("builtin"):
        parts.append(f"with exactly the same number of Python calls per step ({calls['plugin']:,.0f})")
    transformer = doc.get("transformer", {})
    gpt2 = transformer.get("ratios", {}).get("plugin/builtin", {}).get("per_round")
    if gpt2:
        parts.append(f"GPT-2 ({transformer['workload']['name']}): {gpt2['median']:.3f} x Lightning's tokens per"
                     f" second (rounds {gpt2['min']:.3f}-{gpt2['max']:.3f})")
    strategies = doc.get("strategies", {})
    ddp = strategies.get("families", {}).get("ddp", {}).get("ratios", {}).get("plugin/lightning", {}).get("per_round")
    if ddp:
        procs = strategies.get("settings", {}).get("processes", 2)
        parts.append(f"DDP with {procs} process{'es' if procs != 1 else ''}: {ddp['median']:.2f} x Lightning's DDP")
    return "; ".join(parts) + "."


def substitute(app: Sphinx, docname: str, source: list[str]) -> None:
    """``{{repository}}``, ``{{version}}`` and the support tokens of :func:`device_pages.substitute_support` in
    the documentation pages (code blocks included)."""
    if docname.startswith("docs/"):
        source[0] = (source[0].replace("{{repository}}", app.config.anyaccel_repository)
                     .replace("{{version}}", app.config.release))
        if device_pages.SUPPORT_TOKEN.search(source[0]):  # sentences about support: the code's decisions
            source[0] = device_pages.substitute_support(source[0], load_validation(Path(app.srcdir)).get("devices", {}))


# ------------------------------------------------------------------------------------------------


REDIRECT = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<meta http-equiv="refresh" content="0; url={target}">
<link rel="canonical" href="{target}">
</head>
<body>
<p><a href="{target}">{title}: documentation</a></p>
</body>
</html>
"""


def write_root_redirect(app: Sphinx, exception: Exception | None) -> None:
    """`index.html` at the top of the site, pointing at the start page."""
    if exception is not None or app.builder.format != "html" or app.config.root_doc == "index":
        return
    target = app.builder.get_target_uri(app.config.root_doc)
    Path(app.outdir, "index.html").write_text(REDIRECT.format(title=app.config.project, target=target))


def check_links_in_notebooks(app: Sphinx, docname: str, source: list[str]) -> None:
    """Notebook markdown must not link to files outside the site (they do not exist there)."""
    if docname.startswith("notebooks/"):
        for target in re.findall(r"\]\((?!https?://|#)([^)]+)\)", source[0]):
            if not target.split("#")[0].endswith((".ipynb", ".md", ".rst")):
                raise ValueError(f"{docname}: link to {target!r}, which is not a page of the site")


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_config_value("anyaccel_repository", "", "env")
    app.add_directive("anyaccel-device-status", DeviceStatus)
    app.add_directive("anyaccel-benchmark-summary", BenchmarkSummary)
    app.connect("builder-inited", write_device_pages)
    app.connect("source-read", substitute)
    app.add_directive("anyaccel-support-matrix", SupportMatrix)
    app.add_directive("anyaccel-support-grid", SupportGrid)
    app.add_directive("anyaccel-device-details", DeviceDetails)
    app.add_directive("anyaccel-install-table", InstallTable)
    app.add_directive("anyaccel-validation", ValidationTable)
    app.add_directive("anyaccel-parity", ParityTable)
    app.add_directive("anyaccel-vendor-suites", vendor_suites.VendorSuites)
    app.connect("source-read", check_links_in_notebooks)
    app.connect("build-finished", write_root_redirect)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
