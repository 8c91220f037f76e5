"""Drop the entries of a uv lock that can never install (marker ``sys_platform == 'never'``).

requirements/no-torch.txt overrides torch to that marker, so torch stays outside the lock; a
universal resolution still lists torch and what only torch needs under the impossible marker.
Removing those entries keeps the lock honest: torch and its own dependencies are not in it.
Usage: ``python requirements/drop_unreachable.py requirements/dev.lock`` (``make lock`` runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

NEVER = "sys_platform == 'never'"


def drop_unreachable(text: str) -> str:
    """``text`` without the entries (requirement line, hashes, ``# via`` lines) marked ``NEVER``."""
    out: list[str] = []
    skipping = False
    for line in text.splitlines(keepends=True):
        if line[:1].strip() and not line.startswith("#"):  # an entry starts in column 0
            skipping = NEVER in line
        elif line.startswith("#"):
            skipping = False
        if not skipping:
            out.append(line)
    return "".join(out)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        path = Path(name)
        path.write_text(drop_unreachable(path.read_text()))
