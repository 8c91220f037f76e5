"""Sphinx extension of the lightning-anyaccel documentation: what it adds, from the modules beside it.

- ``support_tables``: ``anyaccel-support-matrix``, ``anyaccel-support-grid``, ``anyaccel-device-details``,
  ``anyaccel-install-table``, ``anyaccel-validation`` and ``anyaccel-parity``, tables built at build time
  from ``lightning_anyaccel.device.devices.DEVICE_TABLE`` and the validation records (read and worded by
  ``records_text``), so the pages can not drift from the code or from what was run.
- ``device_front``: ``anyaccel-device-status``, the front page's status badge per device family, linking to
  the per-device pages ``docs/devices/<type>.md``, which ``write_device_pages`` generates (from
  ``device_pages``) before Sphinx reads the sources.
- ``benchmark_summary``: ``anyaccel-benchmark-summary``, one sentence per benchmarked device.
- Here: ``{{repository}}`` and ``{{version}}`` in the pages become ``pyproject.toml``'s repository URL and
  the package version (one source for both, also inside code blocks), and the support tokens become the
  code's sentences; notebooks link only to pages of the site; the site's entry point ``index.html``
  redirects to the start page ``docs/index.html``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import device_pages
import vendor_suites
from benchmark_summary import BenchmarkSummary
from device_front import DeviceStatus, write_device_pages
from records_text import load_validation
from sphinx.application import Sphinx
from support_tables import DeviceDetails, InstallTable, ParityTable, SupportGrid, SupportMatrix, ValidationTable


def substitute(app: Sphinx, docname: str, source: list[str]) -> None:
    """``{{repository}}``, ``{{version}}`` and the support tokens of :func:`device_pages.substitute_support` in
    the documentation pages (code blocks included)."""
    if docname.startswith("docs/"):
        source[0] = (source[0].replace("{{repository}}", app.config.anyaccel_repository)
                     .replace("{{version}}", app.config.release))
        if device_pages.SUPPORT_TOKEN.search(source[0]):  # sentences about support: the code's decisions
            source[0] = device_pages.substitute_support(source[0], load_validation(Path(app.srcdir)).get("devices", {}))




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
