"""The users' device pages and the support grid of the lightning-anyaccel documentation.

- :func:`device_page`: the generated page of one device type, ``docs/devices/<type>.md``, written for
  that device's users: what they need (stack versions that work and fail, the vendor's install guide,
  an install block that runs as written), the lines to change, the check, what works, differs or is
  missing against the vendor's own plugin or recipe, what the package does for them, how their
  clusters launch jobs, and how far each feature was proven there. The facts come from
  ``docs/device_pages.toml``, the device table and the validation records.
- :func:`feature_mark`: one mark per device type and feature for the support grid (``H``, ``E``,
  ``S``, ``✗``, ``–``), the strongest level of evidence, with the number of processes where it matters.
- :func:`badge_text`: what ran, in a few words ("NVIDIA H200, 1 process").

How we know (commits, commands, ages) stays on the contributors' page ``docs/evidence.md``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from lightning_anyaccel.strategies.families import FEATURE_FAMILIES, refusal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The levels of evidence, strongest first, with the grid's mark and the users' words for each.
LEVEL_MARKS = {"hardware": "H", "emulated": "E", "simulated": "S"}
LEVEL_WORDS = {
    "hardware": "run on hardware",
    "emulated": "emulated",
    "simulated": "simulated only",
    "untested": "not tested",
}

#: Every feature a validation record reports (keys of its ``features``) in the users' words: the one table of
#: feature names of the site (the support grid, the device pages, the contributors' per-feature table).
FEATURES = {
    "single_device": "1 device",
    "mixed_precision": "mixed precision",
    "ddp": "DDP",
    "fork_safety": "fork check",
    "fsdp": "FSDP",
    "fsdp2": "FSDP2",
    "deepspeed": "DeepSpeed",
    "checkpoint": "checkpoints",
    "device_stats": "memory stats",
    "profiling": "device time in the profiler",
    "verify": "verify",
    "transformer": "GPT-2",
}
#: The columns of the users' grid (the fork check is a detail for contributors).
GRID_FEATURES = tuple(key for key in FEATURES if key != "fork_safety")
#: The runs of parity in the users' words, in the tables' order: a strategy's short name
#: (``kit/tools/parity_run.STRATEGIES``, the test suite's ``[parity]`` section) or a validation kit check's name (its
#: test entry's ``parity``). :func:`parity_name` adds what the short name says beyond these: ``fabric_`` in front
#: (Fabric's loop) and a DeepSpeed stage's ``_offload`` at the end.
PARITY_NAMES = {
    "ddp": "DDP", "ddp_find_unused": "DDP (find_unused_parameters)", "ddp_spawn": "DDP (spawn)",
    "ddp_fork": "DDP (fork)", "fsdp": "FSDP", "fsdp_grad_op": "FSDP (SHARD_GRAD_OP)",
    "fsdp_cpu_offload": "FSDP (CPU offload)", "fsdp2": "FSDP2", "model_parallel": "tensor parallel + FSDP2",
    "deepspeed_1": "DeepSpeed ZeRO-1", "deepspeed_2": "DeepSpeed ZeRO-2", "deepspeed_3": "DeepSpeed ZeRO-3",
    "deepspeed": "DeepSpeed ZeRO-2", "transformer": "GPT-2 with DDP, bf16-mixed",
}


def _parity_parts(name: str) -> tuple[str, bool, bool]:
    """A parity run's short name as (its entry of :data:`PARITY_NAMES`, offloaded, Fabric)."""
    base = name.removeprefix("fabric_")
    offload = base.startswith("deepspeed_") and base.endswith("_offload")
    return base.removesuffix("_offload") if offload else base, offload, base != name


def parity_name(name: str) -> str:
    """A parity run in the users' words: ``fabric_deepspeed_3_offload`` -> ``DeepSpeed ZeRO-3, offloaded, Fabric``."""
    base, offload, fabric = _parity_parts(name)
    return PARITY_NAMES.get(base, name) + (", offloaded" if offload else "") + (", Fabric" if fabric else "")


#: marks of the comparison tables
COMPARE_MARKS = {"yes": "✓", "differs": "⚠", "no": "✗"}
#: strategy families (``lightning_anyaccel.strategies.families``) in the users' words, and what to do where one is refused
FAMILY_WORDS = {"ddp": "DDP", "fsdp": "FSDP", "model_parallel": "FSDP2", "deepspeed": "DeepSpeed"}
INSTEAD = {"deepspeed": 'shard with `strategy="any_fsdp"` or `strategy="any_fsdp2"` instead',
           "": 'train on one device (`strategy="any_single"`)'}


def row_mark(spec: Any, row: list[str]) -> tuple[str, str]:
    """A comparison row's mark and text; a row about a strategy family (its 4th item) follows the code's decision.

    Raises:
        ValueError: the row calls missing a strategy the package runs on the device (the code decides).
    """
    mark, _feature, text, *family = row
    reason = refusal(family[0], spec) if family else None
    if reason:
        instead = INSTEAD.get(family[0], INSTEAD[""]) if spec.backend else INSTEAD[""]
        return "no", f"refused on `{spec.type}` ({reason}): {instead}"
    if family and mark == "no":
        raise ValueError(f"{spec.type}: the row {row!r} says missing, but the package runs {family[0]} there")
    return mark, text


def support_sentence(family: str, spec: Any, entry: dict[str, Any]) -> str:
    """One sentence for the migration page: does the package run ``family`` on the device type, how far proven."""
    words = FAMILY_WORDS[family]
    reason = refusal(family, spec)
    if reason:
        instead = INSTEAD.get(family, INSTEAD[""]) if spec.backend else INSTEAD[""]
        return f"The package refuses {words} on `{spec.type}` ({reason}): {instead}."
    feature = next(f for f, fam in FEATURE_FAMILIES.items() if fam == family)
    return f"{words} runs on `{spec.type}` ({proven_words(spec, entry, feature)} so far)."


#: what the pages' sentences about support may ask (docs/_ext/anyaccel_docs.py substitutes them)
SUPPORT_TOKEN = re.compile(r"\{\{(support|proven):([a-z_0-9]+):([a-z0-9]+)\}\}|\{\{deepspeed_device_types\}\}")


def substitute_support(text: str, validation: dict[str, Any]) -> str:
    """``{{support:FAMILY:TYPE}}`` (:func:`support_sentence`), ``{{proven:FEATURE:TYPE}}`` (:func:`proven_words`)
    and ``{{deepspeed_device_types}}`` in a page: the code's decisions and the records, never typed by hand."""
    from lightning_anyaccel.device.devices import DEVICE_TABLE

    def one(match: re.Match[str]) -> str:
        kind, name, device_type = match.groups()
        if kind is None:
            return ", ".join(t for t, spec in DEVICE_TABLE.items() if not refusal("deepspeed", spec))
        spec, entry = DEVICE_TABLE[device_type], validation.get(device_type, {})
        return support_sentence(name, spec, entry) if kind == "support" else proven_words(spec, entry, name)

    return SUPPORT_TOKEN.sub(one, text)


def ran_here(entry: dict[str, Any], family: str) -> str:
    """The "run here" line of a device page: the hardware the records name, or that no vendor stack was run."""
    runs = [r for r in records_at(entry, "hardware") if r.get("device_name")]
    if runs:
        names = sorted({str(r["device_name"]) for r in runs})
        return f"on {', '.join(names)} ({str(runs[0]['date'])[:10]})"
    return (f"not on {family} hardware yet: the versions above are the vendor's published ones, "
            "and none of these stacks was run here")


def load_pages(srcdir: Path) -> dict[str, Any]:
    """``docs/device_pages.toml``: per device type, what its users need to know."""
    with open(srcdir / "docs" / "device_pages.toml", "rb") as handle:
        return tomllib.load(handle)


def records_at(entry: dict[str, Any], level: str) -> list[dict[str, Any]]:
    """The records of a device type at ``level`` (the test suite's, then any other run at that level)."""
    first = entry.get(level)
    return [first, *entry.get("more", {}).get(level, [])] if isinstance(first, dict) else []


def _processes(record: dict[str, Any], value: str) -> int | None:
    if value.startswith("passed (") and "process" in value:
        digits = "".join(c for c in value if c.isdigit())
        return int(digits) if digits else None
    count = record.get("max_processes")
    return int(count) if isinstance(count, int) else None


def feature_mark(spec: Any, entry: dict[str, Any], feature: str) -> str:
    """The strongest level at which ``feature`` passed on the device type: one mark.

    ``H``/``E``/``S`` (hardware, emulated, simulated); a multi-process feature that trained with a single
    process says so (``H (1)``: a machine with one device); ``✗`` where the package refuses the strategy on
    the device (:func:`lightning_anyaccel.strategies.families.refusal`, what the code refuses with); ``–``
    where nothing ran.
    """
    family = FEATURE_FAMILIES.get(feature)
    if family and refusal(family, spec):
        return "✗"
    for level, mark in LEVEL_MARKS.items():
        for record in records_at(entry, level):
            value = str(record.get("features", {}).get(feature, ""))
            if value.startswith("passed"):
                count = _processes(record, value) if family else None
                return f"{mark} ({count})" if count and count != 2 else mark  # 2: the legend's default
    return "–"


def proven_words(spec: Any, entry: dict[str, Any], feature: str) -> str:
    """``feature_mark`` in words: ``run on hardware``, ``emulated``, ``simulated only``, ``not tested``, ``refused``."""
    mark = feature_mark(spec, entry, feature)
    if mark == "✗":
        return "refused"
    words = {m: LEVEL_WORDS[level] for level, m in LEVEL_MARKS.items()}
    return words.get(mark.split(" ")[0], LEVEL_WORDS["untested"])


def upper_bound(value: float) -> str:
    """``value`` rounded up to one significant digit: ``3.2e-07`` -> ``4e-7`` (a bound, never below the value)."""
    import math

    if value <= 0:
        return "0"
    exponent = math.floor(math.log10(value))
    mantissa = math.ceil(round(value / 10**exponent, 9))
    if mantissa == 10:
        mantissa, exponent = 1, exponent + 1
    return f"{mantissa}e{exponent}"


def _sci(value: float, digits: int = 1) -> str:
    """``3.17e-07`` -> ``3.2e-7``, ``1e-05`` -> ``1e-5``: scientific notation without the exponent's padding."""
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa and set(mantissa.split(".")[1]) == {"0"} else mantissa
    return f"{mantissa}e{int(exponent)}"


def parity_runs(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """Per run of parity, its measurement at the strongest level that has one: ``name`` (:func:`parity_name`),
    ``level``, ``processes``, ``largest`` (difference), ``rtol``, ``atol``, ``date``; in :data:`PARITY_NAMES`' order.

    From a record's ``[parity]`` section (the test suite's) and from the parity of a validation kit check.
    """
    found: dict[str, dict[str, Any]] = {}
    for level in LEVEL_MARKS:
        for record in records_at(entry, level):
            section = record.get("parity") or {}
            measured = [(name, numbers, section.get("processes"), section.get("date"))
                        for name, numbers in section.get("strategies", {}).items()]
            measured += [(name.removeprefix("validate::"), test["parity"], test.get("processes"), record.get("date"))
                         for name, test in record.get("tests", {}).items()
                         if test.get("parity") and test.get("outcome") == "passed"]
            for name, numbers, processes, date in measured:
                if name in found and found[name]["level"] != level:
                    continue  # a stronger level measured it
                largest = max(float(numbers[k]) for k in ("norm", "grad", "update"))
                if name in found and found[name]["largest"] >= largest:
                    continue  # the same level: the largest difference of its records
                found[name] = {"name": name, "level": level, "processes": processes, "largest": largest,
                               "rtol": float(numbers["rtol"]), "atol": float(numbers["atol"]), "date": date}
    order = list(PARITY_NAMES)

    def key(run: dict[str, Any]) -> tuple[int, bool, bool, str]:
        base, offload, fabric = _parity_parts(run["name"])
        return order.index(base) if base in order else len(order), offload, fabric, run["name"]

    return sorted(found.values(), key=key)


def parity_mark(spec: Any, entry: dict[str, Any]) -> str:
    """The grid's parity cell: the largest fp32 difference any strategy measured against one device, rounded up
    (``E ≤4e-7``: emulated), at the strongest level with a measurement; ``✗`` without a collective backend."""
    if refusal("ddp", spec):
        return "✗"
    runs = parity_runs(entry)
    for level, mark in LEVEL_MARKS.items():
        fp32 = [run["largest"] for run in runs if run["level"] == level and run["atol"] > 0]
        if fp32:
            return f"{mark} ≤{upper_bound(max(fp32))}"
    return "–"


def _parity_lines(spec: Any, entry: dict[str, Any]) -> list[str]:
    """The device page's table of parity: per strategy, the largest difference from one device and the tolerance."""
    if refusal("ddp", spec):
        return []
    lines = ["### Same results as one device", "",
             "Each strategy below trained the same model from the same weights on the same rows as one device did, "
             "step by step; the table gives the largest relative difference found in any gradient, update or "
             "gradient norm, and the tolerance it had to meet ([what this means](../validate_hardware.md"
             "#what-a-parity-pass-means)).", ""]
    runs = parity_runs(entry)
    if not runs:
        return [*lines, "Not measured on this device yet.", ""]
    lines += [_row(["strategy", "processes", "largest difference", "tolerance", "where", "when"]),
              _row(["---"] * 6)]
    for run in runs:
        tolerance = (f"rtol {_sci(run['rtol'], 0)}, atol {_sci(run['atol'], 0)}" if run["atol"] > 0
                     else f"{_sci(run['rtol'], 0)} per tensor (bf16)")
        lines.append(_row([parity_name(run["name"]), str(run["processes"] or "–"),
                           _sci(run["largest"]), tolerance, LEVEL_WORDS[run["level"]],
                           str(run["date"])[:10] if run["date"] else "–"]))
    return [*lines, ""]


def badge_text(entry: dict[str, Any]) -> str:
    """What ran, in a few words: ``run on NVIDIA H200, 1 process``, ``emulated, 2 processes``, ``simulated only``."""
    status = entry.get("status", "untested")
    record = entry.get(status)
    if status == "hardware" and isinstance(record, dict):
        count = record.get("max_processes") or 1
        return f"run on {record.get('device_name', 'hardware')}, {count} process{'es' if count != 1 else ''}"
    if status == "emulated" and isinstance(record, dict):
        count = record.get("max_processes") or 1
        return f"emulated, {count} process{'es' if count != 1 else ''}"
    return LEVEL_WORDS.get(status, status)


def family_name(device_type: str, pages: dict[str, Any], default: str) -> str:
    return str(pages.get(device_type, {}).get("family", default))


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _grid_lines(spec: Any, entry: dict[str, Any]) -> list[str]:
    header = [*(FEATURES[f] for f in GRID_FEATURES), "same as 1 device"]
    return [_row(header), _row(["---"] * len(header)),
            _row([*(feature_mark(spec, entry, f) for f in GRID_FEATURES), parity_mark(spec, entry)])]


def device_page(spec: Any, entry: dict[str, Any], facts: dict[str, Any], trainer_lines: str,
                migration: tuple[str, str] | None, fixes: list[tuple[str, str, str]]) -> str:
    """The generated page of one device type (MyST markdown)."""
    family = facts.get("family", spec.name)
    status = entry.get("status", "untested")
    lines = [
        f"# {family}: `{spec.type}`", "",
        "<!-- generated by docs/_ext/device_pages.py from docs/device_pages.toml, DEVICE_TABLE and docs/records -->", "",
        f'<span class="anyaccel-badge anyaccel-badge-{status}">{badge_text(entry)}</span> '
        "([how far each feature was proven](#how-far-each-feature-was-proven))", "",
        "## What you need", "",
        f"- **Vendor stack:** {facts['stack_works']}"
        + (f" ([{facts['source'][0]}]({facts['source'][1]}))." if facts.get("source") else "."),
        f"- **Too old:** {facts['stack_fails']}.",
        f"- **Run here:** {ran_here(entry, family)}.",
        f"- **Install guide:** [{facts['guide'][0]}]({facts['guide'][1]}).", "",
        "Install the vendor's PyTorch first, then this package "
        "(not on PyPI yet; [other ways](../installation.md#installing-the-package)):", "",
        "```bash", facts["install"].strip(), "```", "",
    ]
    if facts.get("install_note"):
        lines += [facts["install_note"], ""]
    lines += ["## The lines to change", "", "```python", trainer_lines, "```", ""]
    if migration:
        lines += [f"Coming from {migration[0]}: [every line to change](../migration.md#{migration[1]}).", ""]
    if not spec.lightning_builtin:
        lines += ["A program you can't edit (a LightningCLI application) trains there with "
                  "`LIGHTNING_ANYACCEL_ACTIVATE=1`: [programs you don't edit](../programs.md).", ""]
    lines += ["## The check", "", "```bash", f"python -m lightning_anyaccel.verify --device {spec.type}", "```", "",
              "It prints what PyTorch sees (devices, collective backend, precisions) and trains a small model "
              "there; a problem comes with the fix to make.", ""]
    compare = facts.get("compare")
    title = f"Compared with [{compare[0]}]({compare[1]})" if compare else "What works"
    lines += [f"## {title}" if compare else "## What works", "",
              (f"✓ offered as in {compare[0]}, ⚠ offered differently, ✗ missing here, with what to do instead."
               if compare else "✓ offered, ⚠ offered with a difference, ✗ missing, with what to do instead.")
              + " How far each was proven on this device: [below](#how-far-each-feature-was-proven).", "",
              "```{list-table}", ":header-rows: 1", ":class: anyaccel-compare", "", "* - feature", "  - here"]
    for row in facts.get("rows", []):
        mark, text = row_mark(spec, row)
        lines += [f"* - {COMPARE_MARKS[mark]} {row[1]}", f"  - {text}"]
    lines += ["```"]
    lines += ["", "## What the package does for you", ""]
    lines += [f"- {gain};" for gain in facts.get("gains", [])]
    if fixes:
        lines += ["", "Problems of Lightning and PyTorch on this device that the package handles for you (each link "
                  "says how, and what is left to you):", ""]
        lines += [f"- {lead} ([{section}](../limitations.md#{anchor}))" for section, anchor, lead in fixes]
    lines += ["", f"## Launching on {family} clusters", "", facts.get("launch", "").strip(), "",
              "## How far each feature was proven", "",
              "**H** ran on hardware, **E** on an emulated device, **S** simulated only "
              "([what each level shows](../evidence.md)); DDP, FSDP, FSDP2 and DeepSpeed trained with 2 processes "
              "unless a number says otherwise, (1): one; "
              "✗ refused here (the table above says why); – not tested; \"same as 1 device\": the largest difference between the "
              "strategies and one device (below).", "", *_grid_lines(spec, entry), "", *_parity_lines(spec, entry),
              "Every device at once: the [support grid](../support_matrix.md). Have this device? "
              "[Validate it](../validate_hardware.md).", ""]
    return "\n".join(lines)
