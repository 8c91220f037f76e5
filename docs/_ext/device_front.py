"""The front door: a status badge per device family, and one generated page per device type.

``write_device_pages`` writes ``docs/devices/<type>.md`` (install, the lines to change, ``verify``,
what ran, known limitations there: ``device_pages.device_page``) before Sphinx reads the sources;
``anyaccel-device-status`` (:class:`DeviceStatus`) links the front page's badges to them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import device_pages
from docutils import nodes
from records_text import load_validation
from sphinx.application import Sphinx
from support_tables import TableDirective

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


class DeviceStatus(TableDirective):
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
