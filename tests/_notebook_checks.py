"""Checks of a notebook's words against its code and outputs (tests/test_lab.py, tests/test_tutorial.py).

- :func:`unstated_numbers`: a number in the prose of an *executed* notebook must be one its code sets or
  asserts, or one its outputs show; anything else is a number a person typed and no run checks.
- :func:`unused_imports`: names a notebook imports and never uses (no linter is installed here:
  ``ast`` is enough for imports).
"""

from __future__ import annotations

import ast
import re
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


def _python(source: str) -> str | None:
    """A code cell as Python: IPython's line magics and shell lines commented out; None for a cell
    magic (%%writefile holds a file, checked as its own module)."""
    if source.startswith("%%"):
        return None
    return "\n".join(re.sub(r"^(\s*)[%!]", r"\1pass  # ", line) for line in source.splitlines())


def unused_imports(sources: list[str]) -> list[str]:
    """Names imported by the code cells ``sources`` (one namespace, like a kernel) and used by none."""
    imported: dict[str, int] = {}
    used: set[str] = set()
    for number, source in enumerate(sources):
        code = _python(source)
        if code is None:
            continue
        tree = ast.parse(code)
        lines = code.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and "noqa: F401" in lines[node.lineno - 1]:
                continue  # imported for what importing does (registering names)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    imported.setdefault(name, number)
            elif isinstance(node, ast.Name):
                used.add(node.id)
        # a magic's arguments use names too ({REPOSITORY} in %pip ...)
        used.update(re.findall(r"\{(\w+)", "\n".join(line for line in source.splitlines()
                                                       if line.lstrip().startswith(("%", "!")))))
    return [f"{name} (cell {number})" for name, number in imported.items() if name not in used]
