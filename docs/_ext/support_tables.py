"""The tables of the support and evidence pages, built at build time from the device table and the records.

``anyaccel-support-matrix``, ``anyaccel-support-grid``, ``anyaccel-device-details``,
``anyaccel-install-table``, ``anyaccel-validation`` and ``anyaccel-parity`` read
``lightning_anyaccel.device.devices.DEVICE_TABLE`` and the validation records (``records_text``), so
the pages can not drift from the code or from what was run. :class:`TableDirective` rebuilds a page
whenever those sources change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import device_pages
from docutils import nodes
from records_text import LEVELS, age_text, feature_cell, level_text, load_records, load_validation
from sphinx.util.docutils import SphinxDirective


def inline(text: Any) -> nodes.paragraph:
    """A paragraph from `text`; parts between backticks become inline code."""
    para = nodes.paragraph()
    for i, part in enumerate(str(text).replace("\n", " ").split("`")):
        if part:
            para += nodes.literal(part, part) if i % 2 else nodes.Text(part)
    return para


def table_node(header: list[str], rows: list[list[Any]], widths: list[int] | None = None,
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
                entry += inline(value)
                row += entry
            section += row
    group += head
    group += body
    return table



class TableDirective(SphinxDirective):
    """A directive whose :meth:`tables` build its tables; the page is rebuilt when the records or the device table change."""

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


class SupportMatrix(TableDirective):
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
        return [table_node(header, rows, classes=["anyaccel-support-matrix"])]


class SupportGrid(TableDirective):
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
        return [table_node(["device", *(device_pages.FEATURES[f] for f in device_pages.GRID_FEATURES), "same as 1 device"], rows,
                       classes=["anyaccel-grid"])]


def _rank_device(spec: Any) -> str:
    """The "device of each rank" cell: ``<type>:LOCAL_RANK``, or one card per process seen as ``<type>:0``."""
    if spec.process_device_env:
        return f"one card per process, as `{spec.type}:0`; cards chosen by `{spec.process_device_env}`"
    return f"`{spec.type}:LOCAL_RANK`" if spec.backend and spec.type != "cpu" else "-"


class DeviceDetails(TableDirective):
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
        return [table_node(header, rows)]


class InstallTable(TableDirective):
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
        return [table_node(header, rows, widths=[8, 18, 38, 18, 18])]


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


class ValidationTable(TableDirective):
    """The ends of the supported ranges and, per device type, what ran where, from the records."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        data = load_validation(Path(self.env.srcdir))
        devices = data.get("devices", {})
        rows = [[f"`{t}`", *(level_text(devices.get(t, {}), level) for level in LEVELS)] for t in DEVICE_TABLE]
        features = [[f"`{t}`", *(feature_cell(devices.get(t, {}), f) for f in device_pages.FEATURES)] for t in DEVICE_TABLE]
        return [table_node(["version", "role", "records"], _range_rows(data), widths=[16, 34, 50]),
                table_node(["device type", *(device_pages.LEVEL_WORDS[level] for level in LEVELS)], rows,
                       widths=[10, 30, 30, 30]),
                table_node(["device type", *device_pages.FEATURES.values()], features)]



class ParityTable(TableDirective):
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
            return [inline("No record carries parity yet.")]
        return [table_node(["record", "measured by", "largest relative difference per strategy"], rows,
                       widths=[16, 44, 40])]
