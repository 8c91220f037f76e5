"""lightning_anyaccel.kit.tutorial: what the notebooks import instead of writing it again."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from lightning_anyaccel.kit import tutorial
from lightning_anyaccel.kit.tutorial import digits


def test_html_table_escapes_what_it_shows():
    html = tutorial.html_table([("<b>", 1)], ["name", "count"]).data
    assert "<td>&lt;b&gt;</td><td>1</td>" in html and html.startswith('<table class="anyaccel-table">')


def test_show_source_shows_the_code_that_runs():
    shown = tutorial.show_source(digits.DigitsCNN)
    assert "class DigitsCNN(L.LightningModule):" in shown.data
    assert "def configure_optimizers" in shown.data


def test_copy_script_copies_the_packaged_script(tmp_path):
    copied = tutorial.copy_script("train_digits.py", tmp_path)
    assert copied.read_text() == (tutorial.HERE / "train_digits.py").read_text()
    with pytest.raises(FileNotFoundError):
        tutorial.copy_script("no_such_script.py", tmp_path)


def test_the_training_script_takes_both_spellings_of_num_nodes(tmp_path):
    """The launch scripts pass --num_nodes (the Aurora example's spelling); the tutorial spells --num-nodes."""
    script = tutorial.copy_script("train_digits.py", tmp_path)
    out = tutorial.run_script([sys.executable, str(script), "--help"], timeout=120)
    assert "--num-nodes NUM_NODES, --num_nodes NUM_NODES" in out


def test_run_script_raises_with_the_output_of_a_failed_or_endless_command():
    with pytest.raises(RuntimeError, match="exited with 3:\nbroken"):
        tutorial.run_script([sys.executable, "-c", "print('broken'); raise SystemExit(3)"], timeout=60)
    with pytest.raises(RuntimeError, match="did not finish in 1 s"):
        tutorial.run_script([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1)


def test_run_together_kills_every_job_when_one_fails(tmp_path):
    jobs = {"ok": ([sys.executable, "-c", "import time; time.sleep(60)"], {}),
            "bad": ([sys.executable, "-c", "raise SystemExit(2)"], {})}
    with pytest.raises(RuntimeError, match="ok: timed out; bad: exit code 2"):
        tutorial.run_together(jobs, timeout=2, log_dir=tmp_path)


def test_digits_splits_are_stratified_and_fixed():
    train, val, test = digits.digits_splits()
    assert [len(s) for s in (train, val, test)] == [1257, 270, 270]
    labels = torch.cat([s.tensors[1] for s in (train, val, test)])
    for split in (train, val, test):  # every class in proportion, within one sample of its share
        share = torch.bincount(labels, minlength=10) * len(split) / len(labels)
        assert (torch.bincount(split.tensors[1], minlength=10) - share).abs().max() < 1, split
    again = digits.digits_splits()[2]
    assert (again.tensors[1] == test.tensors[1]).all() and torch.equal(again.tensors[0], test.tensors[0])
    assert not torch.equal(digits.digits_splits(seed=1)[2].tensors[0], test.tensors[0])


def test_the_digits_are_scikit_learns_read_without_importing_it():
    code = ("import sys; from lightning_anyaccel.kit.tutorial.digits import digits_splits; "
            "import torch; x = torch.cat([s.tensors[0] for s in digits_splits()]).reshape(-1, 64) * 16; "
            "imported = 'sklearn' in sys.modules; from sklearn.datasets import load_digits; "
            "ref = torch.tensor(load_digits().data, dtype=torch.float32); "
            "print(imported, sorted(map(tuple, x.tolist())) == sorted(map(tuple, ref.tolist())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False True", out.stderr[-2000:]


def test_importing_the_package_does_not_import_the_tutorial():
    code = "import sys, lightning_anyaccel; print('lightning_anyaccel.kit.tutorial' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_copy_script_copies_a_launch_script_of_the_repository(tmp_path):
    copied = tutorial.copy_script("launch/torchrun.sh", tmp_path)
    repository = tutorial.HERE.parents[3] / "scripts" / "launch" / "torchrun.sh"
    assert copied.read_text() == repository.read_text() and copied.stat().st_mode & 0o111


def test_finish_records_the_run_time_the_next_header_shows(tmp_path, monkeypatch, capsys):
    from lightning_anyaccel.kit.tutorial import session

    with pytest.raises(RuntimeError, match="finish\\(\\) before start\\(\\)"):
        monkeypatch.setattr(session, "_started", {})
        session.finish()
    record = tmp_path / "run_times.json"
    monkeypatch.setenv(session.RECORD_ENV, str(record))
    monkeypatch.setattr(session, "_started", {"07_made_up": time.time() - 42})
    session.finish()
    assert "07_made_up: 42 s from the kernel's start to here" in capsys.readouterr().out
    times = json.loads(record.read_text())
    assert times["07_made_up"]["seconds"] == pytest.approx(42, abs=2)
    assert session.run_time_line("07_made_up", times).startswith("Run time: 42 s on ")
    assert session.run_time_line("08_never_ran", times) == \
        "Run time: not measured yet (`make notebook-times` measures it)."


def _notebook(markdown: str, code: str, output: str) -> dict:
    return {"cells": [{"cell_type": "markdown", "source": [markdown]},
                      {"cell_type": "code", "source": [code],
                       "outputs": [{"output_type": "stream", "name": "stdout", "text": [output]}]}]}


def test_a_number_in_the_text_must_come_from_the_run():
    """The check tests/test_lab.py runs on every executed notebook, failing on a made-up one."""
    from _notebook_checks import unstated_numbers

    typed = _notebook("The accuracies differ by 1.5 points on 1,797 images.", "acc = fit()",
                      "differ by 0.7 points; 1797 images")
    assert unstated_numbers(typed) == ["1.5 in: The accuracies differ by 1.5 points on 1,797 images."]
    measured = _notebook("## 2. Heading\nAt least 0.9 in notebook 3 (`devices=4`): 98.5 % of "
                         "[the guide](https://x/y_2.html).", "assert acc >= 0.9", "accuracy 0.985")
    assert unstated_numbers(measured) == []


def test_an_unused_import_in_a_notebook_is_found(tmp_path):
    """The linter the notebook tests run (tests/test_lab.py) finds an unused import across cells, and lets an
    import kept for what importing does (``noqa: F401``) and a name a magic uses pass."""
    from _notebook_checks import lint

    cells = ["import json\nfrom pathlib import Path\nimport this  # noqa: F401",
             "%pip install -q {Path}\nprint(Path('.'))"]
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None}
                          for c in cells], "metadata": {"language_info": {"name": "python"}}, "nbformat": 4,
                "nbformat_minor": 5}
    (tmp_path / "nb.ipynb").write_text(json.dumps(notebook))
    findings = lint("nb.ipynb", cwd=tmp_path)
    assert "F401" in findings and "`json`" in findings and "this" not in findings, findings
    assert "F401" in lint("x.py", "import os\n", cwd=tmp_path)
