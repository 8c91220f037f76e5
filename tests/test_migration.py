"""The migration guide's "after" code runs: every file under ``docs/migration/`` that the page includes.

``docs/migration.md`` shows each mapping as a diff and includes the file its "after" side comes
from. Here:

- every "after" line of every diff is a line of the file included below it (so the diff can not
  drift from the code that is run);
- the Gaudi (``hpu``), XPU and SDAA files are executed on a simulated device of that type
  (``tests/fakes.py``): their Trainers are built and checked (strategy class and front end,
  devices, collective backend, precision device), not fitted: there is no such hardware here;
- the file for Lightning's built-in accelerators trains for real, two processes on CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import AUTOLOAD, LEAN_IMPORTS, ROOT, SRC, run_python
from fakes import install_fake_device

PAGE = ROOT / "docs" / "migration.md"
SNIPPETS = ROOT / "docs" / "migration"
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (pip install lightning-anyaccel[deepspeed])")


def diffs_and_includes() -> list[tuple[list[str], Path]]:
    """``(after lines, included file)`` for every diff of the page, paired with the next include."""
    text = PAGE.read_text()
    blocks = re.finditer(r"```diff\n(.*?)```|```\{literalinclude\} (\S+)", text, flags=re.S)
    pairs: list[tuple[list[str], Path]] = []
    pending: list[list[str]] = []
    for block in blocks:
        if block.group(1) is not None:
            lines = block.group(1).splitlines()
            pending.append([line[1:].strip() for line in lines if line[:1] in "+ " and line[1:].strip()])
        else:
            path = (PAGE.parent / block.group(2)).resolve()
            pairs += [(after, path) for after in pending]
            pending = []
    assert not pending, "a diff at the end of the page is not followed by the file it comes from"
    return pairs


def _python_diffs() -> list[tuple[str, list[str], list[str]]]:
    """``(section, removed lines, added and kept lines)`` of every Python diff of the page."""
    text = PAGE.read_text()
    found, section = [], ""
    for block in re.finditer(r"^## ([^\n]+)$|```diff\n(.*?)```", text, flags=re.S | re.M):
        if block.group(1):
            section = block.group(1)
            continue
        lines = block.group(2).splitlines()
        if any("PBS_NODEFILE" in line for line in lines):
            continue  # the job script's diff is bash
        found.append((section, [ln[1:] for ln in lines if ln[:1] == "-"], [ln[1:] for ln in lines if ln[:1] in "+ "]))
    return found


def _imported(lines: list[str]) -> set[str]:
    """Names the lines import (``import a.b``, ``from m import (A, B)``, ``import x as y``)."""
    joined = "\n".join(lines)
    names = set()
    for module in re.findall(r"^\s*import ([\w.]+)(?: as (\w+))?", joined, flags=re.M):
        names.add(module[1] or module[0].split(".")[0])
    groups = re.findall(r"from [\w.]+ import \(([^)]*)\)", joined) + re.findall(r"^\s*from [\w.]+ import ([^(\n]+)$",
                                                                              joined, flags=re.M)
    for group in groups:
        names |= {part.split("#")[0].split(" as ")[-1].strip() for part in group.replace("\n", ",").split(",")
                  if part.split("#")[0].strip()}
    return names


def test_diffs_import_what_their_added_lines_use_and_name_current_precisions() -> None:
    """A reader copies the added lines: every class or module they use is imported by the diff (or by an
    earlier diff of the same section, or was already used by the removed lines), and their precision
    names are Lightning's current ones (``"bf16"`` alone is discouraged by Lightning)."""
    diffs = _python_diffs()
    assert len(diffs) >= 7
    problems, seen = [], {}
    for section, removed, added in diffs:
        known = seen.setdefault(section, set()) | _imported(added) | {"pl", "torch", "Trainer"}
        before = "\n".join(removed)
        for line in added:
            code = line.split("#")[0]
            for name in re.findall(r"(?<![\w.])([A-Z]\w+|torch)(?=[(.])", code):
                if name not in known and not re.search(rf"\b{name}\b", before):
                    problems.append(f"{section}: {name} used but not imported: {line.strip()}")
            problems += [f"{section}: old precision name: {line.strip()}"
                         for _ in re.findall(r"precision=[\"'](?:bf16|16|32|64)[\"']", code)]
        seen[section] |= _imported(added)
    assert not problems, "\n".join(problems)
    # the check can fail: the 16-mixed diff as it once was
    assert "MixedPrecision" not in _imported(["no_scaling = MixedPrecision('16-mixed', 'hpu')"])


def test_every_diff_is_followed_by_the_file_its_after_side_comes_from() -> None:
    pairs = diffs_and_includes()
    assert len(pairs) >= 7
    for after, path in pairs:
        assert path.exists(), path
        lines = {line.strip() for line in path.read_text().splitlines()}
        missing = [line for line in after if line not in lines]
        assert not missing, f"after-lines of a diff not in {path.relative_to(ROOT)}: {missing}"
    included = {path for _, path in pairs}
    assert {p.resolve() for p in SNIPPETS.glob("*.py")} <= included, "a file of docs/migration/ is not on the page"


def _describe(trainer: Any) -> dict[str, Any]:
    strategy = trainer.strategy
    devices = getattr(strategy, "parallel_devices", None) or [strategy.root_device]
    backend = getattr(strategy, "_get_process_group_backend", None)
    return {
        "strategy": type(strategy).__name__,
        "module": type(strategy).__module__,
        "devices": [str(d) for d in devices],
        "num_nodes": trainer.num_nodes,
        "backend": backend() if backend is not None and len(devices) > 1 else None,
        "precision": type(strategy.precision_plugin).__name__,
        "precision_device": getattr(strategy.precision_plugin, "device", None),
        "scaler_enabled": getattr(getattr(strategy.precision_plugin, "scaler", None), "is_enabled", lambda: None)(),
        "inference": {k: v if isinstance(v, (dict, bool)) else str(v)
                      for k, v in getattr(strategy, "inference_kwargs", {}).items()},
        "profiler": _profiled(trainer),
    }


def _profiled(trainer: Any) -> dict[str, Any] | None:
    """What a Trainer's ``PyTorchProfiler`` records and sorts by, and what the package plans for its device."""
    from lightning.pytorch.profilers import PyTorchProfiler

    from lightning_anyaccel import _lightning
    from lightning_anyaccel.device.profiling import profiler_plan

    if not isinstance(trainer.profiler, PyTorchProfiler):
        return None
    plan = profiler_plan(trainer.strategy.root_device.type)
    return {"activities": [a.name for a in _lightning.profiler_kwargs(trainer.profiler)["activities"]],
            "sort_by": trainer.profiler._sort_by_key,
            "planned": [[a.name for a in plan.activities], plan.sort_key]}


def _trainers(namespace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: _describe(value) for name, value in namespace.items() if type(value).__name__ == "Trainer"}


@needs_deepspeed
def test_habana_after_on_a_simulated_gaudi(monkeypatch) -> None:
    install_fake_device(monkeypatch, "hpu", count=8, backend="hccl")
    got = _trainers(runpy.run_path(str(SNIPPETS / "habana_after.py")))
    assert set(got) == {"one", "eight", "single", "parallel", "listed", "deepspeed", "fsdp", "bf16", "fp16", "inference",
                        "profiled"}
    profiled = got["profiled"]["profiler"]  # the host only here: this torch records no hpu activity
    assert profiled["planned"] == [profiled["activities"], profiled["sort_by"]] == [["CPU"], "cpu_time_total"]
    hpus = ["hpu:0"] * 8  # every rank's device: each process sees only its own Gaudi (HABANA_VISIBLE_MODULES)
    for name in ("one", "single", "bf16"):
        assert (got[name]["strategy"], got[name]["devices"]) == ("AnySingleDeviceStrategy", ["hpu:0"]), got[name]
    for name, strategy in (("eight", "AnyDDPStrategy"), ("parallel", "AnyDDPStrategy"), ("listed", "AnyDDPStrategy"),
                           ("deepspeed", "AnyDeepSpeedStrategy"), ("fsdp", "AnyFSDPStrategy"),
                           ("inference", "AnyDeepSpeedStrategy")):
        assert (got[name]["strategy"], got[name]["devices"]) == (strategy, hpus), got[name]
        assert got[name]["module"].startswith("lightning_anyaccel.strategies")
    assert got["eight"]["backend"] == got["parallel"]["backend"] == "hccl"
    assert got["parallel"]["num_nodes"] == 2
    assert (got["bf16"]["precision"], got["bf16"]["precision_device"]) == ("MixedPrecision", "hpu")
    assert got["fsdp"]["precision_device"] == "hpu"
    assert got["deepspeed"]["precision"] == "DeepSpeedPrecision"
    assert (got["fp16"]["precision"], got["fp16"]["precision_device"]) == ("MixedPrecision", "hpu")
    assert got["fp16"]["scaler_enabled"] is False and got["deepspeed"]["inference"] == {}
    assert got["inference"]["inference"] == {"tensor_parallel": {"tp_size": 8}, "dtype": "torch.float32",
                                             "replace_with_kernel_inject": True}


@needs_deepspeed
def test_aurora_after_on_a_simulated_xpu(monkeypatch) -> None:
    install_fake_device(monkeypatch, "xpu", count=12, backend="xccl")
    got = _trainers(runpy.run_path(str(SNIPPETS / "aurora_after.py")))
    assert set(got) == {"ddp", "deepspeed", "offload"}
    for name, strategy in (("ddp", "AnyDDPStrategy"), ("deepspeed", "AnyDeepSpeedStrategy"),
                           ("offload", "AnyDeepSpeedStrategy")):
        report = got[name]
        assert (report["strategy"], report["module"]) == (strategy, "lightning_anyaccel.pytorch_lightning"), report
        assert report["devices"] == [f"xpu:{i}" for i in range(12)] and report["num_nodes"] == 2
        assert report["backend"] == "xccl"
    assert (got["ddp"]["precision"], got["ddp"]["precision_device"]) == ("MixedPrecision", "xpu")


TECO = textwrap.dedent(
    """
    import json, runpy, sys, torch
    sys.path.insert(0, {tests!r})
    torch.utils.rename_privateuse1_backend("sdaa")  # what torch_sdaa does, once per process
    import pytest
    from fakes import install_fake_device
    from test_migration import _trainers

    install_fake_device(pytest.MonkeyPatch(), "sdaa", count=8)
    torch.distributed.Backend.register_backend("tccl", lambda *a, **k: None, devices=["sdaa"])
    print("RESULT" + json.dumps(_trainers(runpy.run_path({snippet!r}))))
    """
)


def test_teco_after_on_a_simulated_sdaa() -> None:
    """SDAA is a PrivateUse1 device: renaming the backend is once per process, so a child runs it."""
    script = TECO.format(tests=str(ROOT / "tests"), snippet=str(SNIPPETS / "teco_after.py"))
    proc = run_python(["-c", script], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    got = json.loads(proc.stdout.split("RESULT", 1)[1])
    sdaas = [f"sdaa:{i}" for i in range(8)]
    assert (got["one"]["strategy"], got["one"]["devices"]) == ("AnySingleDeviceStrategy", ["sdaa:0"])
    for name in ("several", "ddp"):
        assert (got[name]["strategy"], got[name]["devices"], got[name]["backend"]) == ("AnyDDPStrategy", sdaas, "tccl")
    assert (got["ddp"]["precision"], got["ddp"]["precision_device"]) == ("MixedPrecision", "sdaa")
    profiled = got["profiled"]["profiler"]  # torch lists sdaa's activity, but no activity profiler is registered
    assert profiled["planned"] == [profiled["activities"], profiled["sort_by"]] == [["CPU"], "cpu_time_total"]


@pytest.mark.slow
def test_builtin_after_trains_with_two_processes(tmp_path: Path) -> None:
    """``accelerator="gpu"`` -> ``"any"``: the file trains for real (CPU here), ``"ddp"`` -> the package's DDP."""
    proc = run_python([str(SNIPPETS / "builtin_after.py")], timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = re.findall(r"rank (\d): (\w+) on (\S+), loss ([\d.]+) -> ([\d.]+)", proc.stdout)
    assert sorted(line[0] for line in lines) == ["0", "1"], proc.stdout[-3000:]
    for _, strategy, device, first, last in lines:
        assert (strategy, device) == ("AnyDDPStrategy", "cpu")
        assert float(last) < float(first)
    assert torch.device(lines[0][2]).type == "cpu"


TECO_SPELLINGS = textwrap.dedent(
    """
    import lightning_anyaccel
    from lightning import Trainer
    from lightning_anyaccel import AnySingleDeviceStrategy

    kept = Trainer(accelerator="sdaa", strategy="deepspeed_stage_2", devices=2, logger=False)
    print("DEEPSPEED", type(kept.strategy).__name__, kept.strategy.config["zero_optimization"]["stage"])
    try:
        Trainer(accelerator="sdaa", strategy=AnySingleDeviceStrategy(), devices="auto", logger=False)
    except Exception as err:
        print("SINGLE", err)
    """
)


def test_teco_spellings_deepspeed_kept_and_one_strategy_on_every_device_refused() -> None:
    """On the emulated sdaa with 2 devices (torch_sdaa stood in for): a Teco user keeps
    ``strategy="deepspeed_stage_2"``; ``SingleSDAAStrategy()``'s spelling with ``devices="auto"``, which trains on
    one device in lightning-teco, is refused here, naming ``devices=1`` (docs/migration.md)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install lightning-anyaccel[deepspeed])")
    env = {"LIGHTNING_ANYACCEL_EMULATE": "sdaa:2", "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), str(SRC), str(LEAN_IMPORTS)])}
    proc = run_python(["-c", TECO_SPELLINGS], timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "DEEPSPEED AnyDeepSpeedStrategy 2" in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"SINGLE strategy='any_single' trains on one device, but devices= selected 2: .* Use devices=1",
                     proc.stdout), proc.stdout[-3000:]
