"""Checks of a notebook's words against its code and outputs (tests/test_lab.py, tests/test_tutorial.py).

- :func:`unstated_numbers`: a number in the prose of an *executed* notebook must be one its code sets or
  asserts, or one its outputs show; anything else is a number a person typed and no run checks.
- :func:`lint`: ruff (pyproject's rules) on a notebook, or on a module a notebook writes.
- :func:`code_in_emphasis`: inline code inside bold or italics, which the site shows with its backticks (nbsphinx
  converts a notebook's Markdown to reStructuredText, where inline markup does not nest);
- :func:`chain_problems`: each notebook but the last ends with ``Next: [<the next one's title>](<its file>).``,
  so the notebooks read as one path, 01 to the last.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: a number as prose writes it: 1,797 / 0.9 / 70; not part of a word (bf16, GPT-2, 8x8, FSDP2)
PROSE_NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:,\d{3})*(?:\.\d+)?(?![\w\-])")
#: any number in code or output text (also 0.985 in "98.5%" and 1797 in "n=1797")
ANY_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")


def _value(token: str) -> float:
    return float(token.replace(",", ""))


def _prose(markdown: str) -> str:
    """The sentences of a markdown cell: no headings, code spans, code blocks, links' targets or link
    texts that name another notebook ("[3. Train on several cards](03_multi_card.ipynb)")."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\[[^\]]*\]\([^)]*\.ipynb[^)]*\)", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"(?i)\bnotebooks? \d+(?:(?:,| and| or) \d+)*", " ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _outputs_text(cell: dict[str, Any]) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append("".join(out.get("text", "")))
        for kind in ("text/plain", "text/markdown", "text/html"):
            parts.append("".join(out.get("data", {}).get(kind, "")))
    return "\n".join(parts)


def unstated_numbers(notebook: dict[str, Any]) -> list[str]:
    """Numbers the prose of an executed ``notebook`` names that neither its code nor its outputs hold."""
    known: set[float] = set()
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            for text in ("".join(cell["source"]), _outputs_text(cell)):
                known.update(_value(t) for t in ANY_NUMBER.findall(text))
    as_percent = {k * 100 for k in known}  # 98.5 % (or points) is 0.985
    missing = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        prose = _prose("".join(cell["source"]))
        for match in PROSE_NUMBER.finditer(prose):
            percent = re.match(r"\s?(%|percent|points?)", prose[match.end():])
            candidates = known | as_percent if percent else known
            if not any(abs(_value(match.group()) - k) < 1e-9 for k in candidates):
                end = prose.find("\n", match.end())
                line = prose[prose.rfind("\n", 0, match.start()) + 1:end if end >= 0 else None]
                missing.append(f"{match.group()} in: {line.strip()}")
    return missing


#: bold or italics (``**...**``, ``*...*``) on one line holding inline code
CODE_IN_EMPHASIS = re.compile(r"\*\*[^*\n]*`[^*\n]*\*\*|(?<![*\w])\*[^*\s][^*\n]*`[^*\n]*\*(?![*\w])")


def code_in_emphasis(notebook: dict[str, Any]) -> list[str]:
    """The bold or italic spans of ``notebook``'s Markdown that hold inline code (the site shows their backticks)."""
    found = []
    for text in _markdown(notebook):
        text = re.sub(r"```.*?```", " ", text, flags=re.S)
        found += [m.group(0) for m in CODE_IN_EMPHASIS.finditer(text)]
    return found


#: the link to the next notebook that ends a notebook's last markdown cell
NEXT_LINK = re.compile(r"^Next: \[([^\]]+)\]\(([^)]+)\)\.?$", re.M)


def _markdown(notebook: dict[str, Any]) -> list[str]:
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"]


def chain_problems(notebooks: dict[str, dict[str, Any]]) -> list[str]:
    """What breaks the chain of ``notebooks`` (file name -> notebook, in their order): each one's last markdown
    cell ends with ``Next:`` linking the following notebook by its title (its first heading, ``# 2. Train on a
    single card``), and no other ``Next:`` link stands anywhere; the last notebook has none."""
    names = list(notebooks)
    problems = []
    for i, name in enumerate(names):
        cells = _markdown(notebooks[name])
        links = [(n, m) for n, text in enumerate(cells) for m in NEXT_LINK.finditer(text)]
        if i == len(names) - 1:
            problems += [f"{name}: the last notebook links a next one ({m.group(2)})" for _, m in links]
            continue
        following = names[i + 1]
        title = _markdown(notebooks[following])[0].splitlines()[0].removeprefix("# ").strip()
        wanted = f"Next: [{title}]({following})."
        if len(links) != 1 or links[0][0] != len(cells) - 1 or not cells[-1].rstrip().endswith(wanted):
            found = [m.group(0) for _, m in links] or "none"
            problems.append(f"{name}: its last markdown cell must end with {wanted!r} (found: {found})")
    return problems


def lint(path: str, source: str | None = None, cwd: Path | None = None, select: str | None = None) -> str:
    """ruff's findings on the notebook or file ``path`` (with ``source``: that text, checked as the file ``path``,
    e.g. a module a notebook writes with ``%%writefile``), with pyproject's rules or the rules ``select``
    (``"F"``: pyflakes'); ``""`` when there are none."""
    import subprocess
    import sys

    args = ["--stdin-filename", path, "-"] if source is not None else [path]
    if select:
        args = ["--select", select, *args]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                            input=source, capture_output=True, text=True, cwd=cwd, timeout=60)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"ruff failed (exit {result.returncode}): {result.stderr}")
    return result.stdout.strip() if result.returncode else ""
