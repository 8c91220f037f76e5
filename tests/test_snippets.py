"""The examples the documentation shows from files, and the rules for its code blocks.

The code blocks of README.md and docs/*.md are themselves tests (Sybil, configured in the
repository's ``conftest.py``; ``make test-snippets`` runs them alone). Blocks shown from files
(``literalinclude``) come from files that tests run: the two examples here and
``examples/shard_train.py`` (``test_sharding_cpu.py``, both front ends).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

# the docs extra (`pip install -e .[docs]`); a hardware validation run (`-m device_generic`) may lack it
pytest.importorskip("sybil", reason="sybil (docs extra) is not installed: the documentation's code blocks are not checked")
from sybil.document import Document  # noqa: E402
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer  # noqa: E402

from lightning_anyaccel.kit.tools.demo import demo_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: languages the snippet tests run or check; every other fence must be a MyST directive
CHECKED = {"python", "bash"}
#: other languages, on the pages whose own tests check them
CHECKED_ELSEWHERE = {
    ("migration.md", "diff"): "tests/test_migration.py: every 'after' line is in the included file it runs",
    ("validate_hardware.md", "toml"): "test_toml_blocks_parse below",
    ("contributing.md", "toml"): "test_expected_skip_example_is_an_entry below",
    ("programs.md", "text"): "tests/test_programs.py: the programs print these lines",
    ("programs.md", "yaml"): "tests/test_auto_device.py: a LightningCLI program parses it",
    ("emulate.md", "text"): "tests/test_emulate.py: the command prints this report for such a program",
    ("profiling.md", "text"): "tests/test_profiling.py: the emulated npu without an activity profiler logs this line",
    ("troubleshooting.md", "text"): "tests/test_faults_hangs.py: a stalled job prints these lines",
}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_checked(page):
    """No code block in a language the snippet tests would silently pass over."""
    document = Document(page.read_text(encoding="utf-8"), str(page))
    lexer = FencedCodeBlockLexer(language=r".*")
    languages = [region.lexemes["language"] for region in lexer(document)]
    unchecked = [lang for lang in languages if lang not in CHECKED and not lang.startswith("{")
                 and (page.name, lang) not in CHECKED_ELSEWHERE]
    assert not unchecked, f"{page.name}: code blocks in {unchecked}: use ```python or ```bash (both are tests)"


def shown_record_lines(block: str, record: str) -> list[str]:
    """The lines of a record shown on a page (``block``) that are not lines of the ``record`` it names."""
    lines = set(record.splitlines())
    return [line for line in block.splitlines() if line.strip() and not line.startswith("[") and line not in lines]


def test_toml_blocks_parse():
    """The TOML shown on the hardware page parses, and the validation record it shows is a committed record,
    shortened: each of its lines is a line of the record the sentence before it names (no made-up values)."""
    import tomllib

    page = ROOT / "docs" / "validate_hardware.md"
    text = page.read_text(encoding="utf-8")
    lexer = FencedCodeBlockLexer(language=r"toml")
    blocks = [str(region.lexemes["source"]) for region in lexer(Document(text, str(page)))]
    assert blocks
    records = [block for block in blocks if "device_name =" in block]
    assert records
    for block in blocks:
        tomllib.loads(block)
    for block in records:
        before = text[:text.index(block)]
        named = re.findall(r"`(docs/records/[\w/-]+\.toml)`", before)
        assert named, f"the record shown does not say which committed record it is: {block[:80]!r}"
        record = (ROOT / named[-1]).read_text(encoding="utf-8")
        assert shown_record_lines(block, record) == [], named[-1]
    assert shown_record_lines('device_name = "Intel(R) Data Center GPU Max 1100"', record)  # made up: found


def test_expected_skip_example_is_an_entry(tmp_path):
    """The expected-skips entry shown on the contributing page loads, and is one of tests/expected_skips.toml."""
    import skip_check

    page = ROOT / "docs" / "contributing.md"
    lexer = FencedCodeBlockLexer(language=r"toml")
    blocks = [str(region.lexemes["source"]) for region in lexer(Document(page.read_text(encoding="utf-8"), str(page)))]
    assert blocks
    listed = skip_check.load(ROOT / "tests" / "expected_skips.toml")
    for number, block in enumerate(blocks):
        example = tmp_path / f"example{number}.toml"
        example.write_text(block)
        assert set(skip_check.load(example)) <= set(listed), block


def test_demo_validation_split_is_the_same_problem():
    """``split="val"``: new samples, same weight, so a model of the training data predicts them."""
    train, val = demo_data().tensors, demo_data(split="val").tensors
    assert len(val[0]) == len(train[0]) // 4 and not torch.equal(val[0][: len(val[0])], train[0][: len(val[0])])
    w = torch.linalg.lstsq(train[0], train[1]).solution
    assert float(((val[0] @ w - val[1]) ** 2).mean()) < 1e-3
    other_problem = demo_data(seed=1).tensors
    assert float(((other_problem[0] @ w - other_problem[1]) ** 2).mean()) > 1.0


@pytest.mark.slow
def test_make_run_example_shows_that_training_worked(python_runner):
    """``examples/train.py`` (what ``make run`` trains): held-out loss before and after, 2 processes."""
    proc = python_runner(["examples/train.py", "--devices", "2", "--max-epochs", "3"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = re.search(r"trained on cpu x 2 for 3 epochs: held-out mean squared error ([\d.]+) before"
                      r" training, ([\d.]+) after", proc.stdout)
    assert found, proc.stdout[-3000:]
    before, after = map(float, found.groups())
    assert after < before / 5, (before, after)
    assert "next: the tutorial notebooks (make lab)" in proc.stdout


@pytest.mark.slow
def test_fabric_example_trains_with_two_processes(python_runner):
    """``examples/fabric_ddp.py``, shown in docs/fabric.md: DDP with 2 processes, loss falls."""
    proc = python_runner(["examples/fabric_ddp.py", "--devices", "2", "--epochs", "5"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    losses = [float(x) for x in re.findall(r"epoch \d+: mean training loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 5 and losses[-1] < losses[0] / 10, losses
    assert "trained on cpu x 2" in proc.stdout
