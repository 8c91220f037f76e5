"""Sphinx extension of the lightning-anyaccel documentation.

- `anyaccel-support-matrix`, `anyaccel-install-table`, `anyaccel-validation`: directives
  that build their tables at build time from `lightning_anyaccel.devices.DEVICE_TABLE` and
  `docs/validation.toml`, so the pages can not drift from the code or from what was run.
- The site's entry point `index.html` redirects to the start page `docs/index.html`.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STATUS_TEXT = {
    "hardware": "run on hardware",
    "emulated": "executed on the emulated device",
    "simulated": "simulated only",
    "untested": "not tested",
}

#: The three levels of evidence, strongest first: a level's sub-table in validation.toml
#: (``[devices.<type>.hardware]``, ``.emulated``, ``.simulated``) says what ran at that level.
LEVELS = ("hardware", "emulated", "simulated")

#: Feature columns of the per-feature table (keys of a level's ``features``).
FEATURE_NAMES = {
    "single_device": "1 device",
    "mixed_precision": "bf16/16-mixed",
    "ddp": "DDP",
    "fork_safety": "fork check",
    "fsdp": "FSDP",
    "fsdp2": "FSDP2",
    "deepspeed": "DeepSpeed",
    "checkpoint": "checkpoints",
    "device_stats": "memory stats",
}


def load_validation(srcdir: Path) -> dict[str, Any]:
    """`docs/validation.toml`: the versions tested and each device type's status."""
    with open(srcdir / "docs" / "validation.toml", "rb") as handle:
        return tomllib.load(handle)


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


def _status(entry: dict[str, Any]) -> str:
    text = STATUS_TEXT.get(entry.get("status", "untested"), entry.get("status", ""))
    return f"{text} ({entry['date']})" if entry.get("date") else text


def _level_text(entry: dict[str, Any], level: str) -> str:
    """One cell of the three-level table: what ran at ``level`` (date and versions), or "no"."""
    sub = entry.get(level)
    if not isinstance(sub, dict):
        return "no"
    parts = [str(sub["date"])] if sub.get("date") else []
    if level == "hardware":
        parts += [f"{k} {sub[k]}" for k in ("device_name", "driver", "torch", "vendor_package") if sub.get(k)]
    if sub.get("passed") is not None:
        parts.append(f"{sub['passed']} passed, {sub.get('failed', 0)} failed")
    if sub.get("what"):
        parts.append(str(sub["what"]))
    return "; ".join(parts) or "yes"


def _feature_cell(entry: dict[str, Any], feature: str) -> str:
    """The strongest level at which ``feature`` passed: H (hardware), E (emulated), S (simulated), or -.

    A pass recorded as ``"passed (1 process)"`` (a machine with one device) keeps its qualifier, e.g.
    ``H (1 process)``, and a multi-process pass at a weaker level is shown next to it.
    """
    cells = []
    for level, mark in zip(LEVELS, ("H", "E", "S")):
        sub = entry.get(level)
        value = str(sub.get("features", {}).get(feature, "")) if isinstance(sub, dict) else ""
        if value == "passed":
            return ", ".join([*cells, mark])
        if value.startswith("passed ("):
            cells.append(mark + value[len("passed"):])
    return ", ".join(cells) or "-"


class _TableDirective(SphinxDirective):
    has_content = False

    def tables(self) -> list[nodes.table]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        # rebuild this page whenever the table's sources change
        self.env.note_dependency(str(Path(self.env.srcdir) / "docs" / "validation.toml"))
        import lightning_anyaccel.devices as devices

        self.env.note_dependency(devices.__file__)
        return list(self.tables())


class SupportMatrix(_TableDirective):
    """Every device type of the device table: names, backend, precisions, behaviour, status."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.devices import DEVICE_TABLE, PRECISION_DTYPES

        validation = load_validation(Path(self.env.srcdir)).get("devices", {})
        rows = []
        for spec in DEVICE_TABLE.values():
            trainer_name = (f'`AnyAccelerator("{spec.type}")`' if spec.lightning_builtin
                            else f'`"{spec.type}"`')
            mixed = [f"`{flag}`" for flag in PRECISION_DTYPES if spec.supports_precision(flag)]
            rows.append([
                f"`{spec.type}` {spec.name}",
                trainer_name,
                f"`{spec.backend}`" if spec.backend else "none: one device only",
                ", ".join(mixed) or "none",
                "safe" if spec.fork_safe_after_init else "unsafe: use popen/spawn",
                _status(validation.get(spec.type, {})),
            ])
        header = ["device", "Trainer(accelerator=...)", "collective backend", "mixed precision",
                  "fork after device init", "validation"]
        return [_table(header, rows, widths=[22, 18, 14, 16, 14, 16], classes=["anyaccel-support-matrix"])]


def _rank_device(spec: Any) -> str:
    """The "device of each rank" cell: ``<type>:<local rank>``, or one card per process seen as ``<type>:0``."""
    if spec.process_device_env:
        return f"one card per process, as `{spec.type}:0`; cards chosen by `{spec.process_device_env}`"
    return f"`{spec.type}:<local rank>`" if spec.backend and spec.type != "cpu" else "-"


class DeviceDetails(_TableDirective):
    """Per device type: vendor package, memory statistics, seeding, profiler, notes."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.devices import DEVICE_TABLE

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
        from lightning_anyaccel.devices import DEVICE_TABLE

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


class ValidationTable(_TableDirective):
    """The versions of the last validation run and, per device type, what ran where."""

    def tables(self) -> list[nodes.table]:
        from lightning_anyaccel.devices import DEVICE_TABLE

        data = load_validation(Path(self.env.srcdir))
        tested = data.get("tested", {})
        versions = [[key, tested[key]] for key in ("date", "python", "torch", "lightning", "machine") if key in tested]
        devices = data.get("devices", {})
        rows = [[f"`{t}`", *(_level_text(devices.get(t, {}), level) for level in LEVELS)] for t in DEVICE_TABLE]
        features = [[f"`{t}`", *(_feature_cell(devices.get(t, {}), f) for f in FEATURE_NAMES)] for t in DEVICE_TABLE]
        return [_table(["tested with", "version"], versions, widths=[20, 80]),
                _table(["device type", "run on hardware", "executed on the emulated device", "simulated only"], rows,
                       widths=[10, 30, 30, 30]),
                _table(["device type", *FEATURE_NAMES.values()], features)]


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
    app.add_directive("anyaccel-support-matrix", SupportMatrix)
    app.add_directive("anyaccel-device-details", DeviceDetails)
    app.add_directive("anyaccel-install-table", InstallTable)
    app.add_directive("anyaccel-validation", ValidationTable)
    app.connect("source-read", check_links_in_notebooks)
    app.connect("build-finished", write_root_redirect)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
