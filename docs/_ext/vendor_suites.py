"""`anyaccel-vendor-suites`: the vendor plugins' own tests against the package, from the record their run wrote.

`make vendor-suites` (scripts/vendor_suites/run.py) writes `docs/records/vendor/suites.toml`; this directive
shows its provenance, the counts per test file with the reasons of the failures, the reasons' totals and the
files not run. A record whose digest does not match its body (edited by hand) fails the build.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Where the run writes its record (relative to the source directory).
RECORD = Path("docs") / "records" / "vendor" / "suites.toml"


def load(path: Path) -> dict[str, Any]:
    """The record in ``path``; raises ``ValueError`` if its body is not what its digest says."""
    text = path.read_text(encoding="utf-8")
    match = re.search(r'^digest = "sha256:([0-9a-f]{64})"\n', text, re.M)
    if not match or hashlib.sha256(text[match.end():].encode()).hexdigest() != match.group(1):
        raise ValueError(f"{path}: its digest does not match: the record was edited after the run wrote it")
    return tomllib.loads(text)


def _categories(counts: dict[str, int]) -> str:
    return ", ".join(f"`{key}` ({n})" for key, n in counts.items()) or "-"


class VendorSuites(SphinxDirective):
    """Provenance, per-file counts and reasons, the reasons' totals and the files not run."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from support_tables import inline as _inline
        from support_tables import table_node as _table

        path = Path(self.env.srcdir) / RECORD
        self.env.note_dependency(str(path))
        record = load(path)
        suites = "; ".join(f"{name} at `{s['commit'][:12]}`" + ("" if s["pinned"] else " (not the pinned commit)")
                           for name, s in record["suites"].items())
        clean = "" if record["tree_clean"] else " with uncommitted changes"
        said = (f"Run on {str(record['date'])[:10]}: the package at `{record['commit'][:12]}`{clean}, torch"
                f" {record['torch']}, Lightning {record['lightning']}, DeepSpeed {record.get('deepspeed', '-')}, Python"
                f" {record['python']}; {suites}. Command: `{record['command']}`; record: `{RECORD.as_posix()}`.")
        rows, totals = [], Counter[str]()
        for entry in record["files"]:
            totals.update(entry["categories"])
            counts = (f"{entry['passed']} / {entry['failed'] + entry['error']} / {entry['skipped']}"
                      + "".join(f", {entry[key]} {key}" for key in ("xfailed", "xpassed") if entry[key]))
            rows.append([f"`{entry['file'].removeprefix('tests/')}` ({entry['suite'].removeprefix('lightning-')},"
                         f" `{entry['emulate']}`)", counts, _categories(entry["categories"])])
        header = ["file (suite, emulated devices)", "passed / failed / skipped", "why they failed (tests)"]
        reasons = [[f"`{key}`", text, totals.get(key, 0)] for key, text in record["categories"].items()]
        reasons += [["`unclassified`", "no reason category matched the message", totals["unclassified"]]] \
            if totals["unclassified"] else []
        not_run = [[f"`{name}`", why] for name, why in record["not_run"].items()]
        return [_inline(said), _table(header, rows, widths=[40, 22, 38]),
                _table(["reason", "what differs", "failing tests"], reasons, widths=[22, 64, 14]),
                _table(["not run", "why: the vendor's own software"], not_run, widths=[50, 50])]
