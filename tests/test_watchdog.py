"""The stall watchdog's own rules (:mod:`lightning_anyaccel.cluster.watchdog`), in one process each.

The jobs of several ranks, launchers and hangs are in ``tests/test_faults_hangs.py``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_anyaccel.cluster import watchdog

PROGRAM = textwrap.dedent("""
    import sys, time
    from lightning_anyaccel.cluster import watchdog
    watchdog.start(0, "unit", float(sys.argv[1]))
    mode = sys.argv[2]
    start = time.monotonic()
    while time.monotonic() < start + 4:
        if mode == "progress-then-disarmed":  # 2 s of steps, then 2 s idle after a disarm (the Trainer's teardown)
            watchdog.progress() if time.monotonic() < start + 2 else watchdog.disarm()
        time.sleep(0.2)
    print("finished")
""")


def run(tmp_path: Path, bound: str, mode: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {"LIGHTNING_ANYACCEL_STALL_DIR": str(tmp_path / "stacks"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(script), bound, mode], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": ":".join(sys.path)})


def test_a_stall_prints_the_stack_names_the_place_and_exits_non_zero(tmp_path: Path) -> None:
    proc = run(tmp_path, "1", "stall")
    assert proc.returncode == watchdog.EXIT_CODE, proc.stderr[-3000:]
    assert "finished" not in proc.stdout
    assert "rank 0 made no progress" in proc.stderr
    assert "rank 0 (pid" in proc.stderr and "program.py:" in proc.stderr, proc.stderr[-3000:]
    assert (tmp_path / "stacks" / "rank0.stack").read_text().count("File ") > 3


def test_progress_then_a_disarmed_watchdog_lets_the_process_run(tmp_path: Path) -> None:
    proc = run(tmp_path, "1", "progress-then-disarmed")
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr[-3000:]


def test_off_and_the_environment_variable() -> None:
    assert watchdog.stall_timeout(0) is None
    assert watchdog.stall_timeout(5) == 5.0
    assert watchdog.stall_timeout(None, {}) == watchdog.DEFAULT_STALL_TIMEOUT_S
    assert watchdog.stall_timeout(None, {watchdog.STALL_TIMEOUT_ENV: "0"}) is None
    with pytest.raises(ValueError, match="LIGHTNING_ANYACCEL_STALL_TIMEOUT"):
        watchdog.stall_timeout(None, {watchdog.STALL_TIMEOUT_ENV: "soon"})


def test_where_a_rank_waits() -> None:
    loader = ['  File "/x/torch/utils/data/dataloader.py", line 1 in _next_data',
              '  File "/x/torch/utils/data/dataloader.py", line 2 in _get_data']
    assert watchdog.where(loader).startswith("in a DataLoader worker's start")
    assert watchdog.where(['  File "/x/torch/distributed/distributed_c10d.py", line 9 in barrier']) == "in barrier"
    user = ['  File "/home/me/train.py", line 42 in training_step', '  File "/x/site-packages/torch/nn/a.py", line 3 in f']
    assert watchdog.where(user) == "at /home/me/train.py:42 in training_step"
    assert watchdog.where([]) == "somewhere without a Python frame"


ONE_DEVICE = textwrap.dedent("""
    import sys, time
    import lightning as L
    import torch
    from torch.utils.data import DataLoader
    import lightning_anyaccel
    from lightning_anyaccel.fabric import AnySingleDeviceStrategy as FabricSingle
    from lightning_anyaccel.strategies import AnySingleDeviceStrategy
    from lightning_anyaccel.kit.tools.demo import DemoModel, demo_data

    def hang(*_):
        while True:
            time.sleep(0.5)

    class SleepingModel(DemoModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                hang()
            return super().training_step(batch, batch_idx)

    mode, bound = sys.argv[1], float(sys.argv[2])
    if mode == "fabric-evaluation":  # forwards only, 3 bounds long, then a stall in the same loop
        fabric = L.Fabric(accelerator="any", strategy=FabricSingle(stall_timeout=bound), devices=1)
        model = fabric.setup(torch.nn.Linear(16, 1))
        start = time.monotonic()
        with torch.no_grad():
            while time.monotonic() < start + 3 * bound:
                model(torch.ones(4, 16))
                time.sleep(0.05)
        print("evaluated", flush=True)
        hang()
    loader = DataLoader(demo_data(), batch_size=32, num_workers=1 if mode == "loader" else 0,
                        worker_init_fn=hang if mode == "loader" else None)
    model = DemoModel() if mode == "loader" else SleepingModel()
    trainer = L.Trainer(accelerator="any", strategy=AnySingleDeviceStrategy(stall_timeout=bound), devices=1,
                        max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)
    print("finished")
""")


def run_one_device(tmp_path: Path, mode: str, bound: float) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "one_device.py"
    script.write_text(ONE_DEVICE)
    env = {"LIGHTNING_ANYACCEL_STALL_DIR": str(tmp_path / "stacks"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(script), mode, str(bound)], capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": ":".join(sys.path)})


@pytest.mark.parametrize(("mode", "where", "stack"), [
    pytest.param("sleep", "one_device.py:13 in hang", "in training_step", id="sleep"),
    pytest.param("loader", "in a DataLoader worker's start", "in _next_data", id="loader"),
])
def test_a_one_device_run_that_hangs_prints_its_stack_and_ends(tmp_path: Path, mode: str, where: str,
                                                              stack: str) -> None:
    """The single-device strategy watches too: a hang in ``training_step`` or a DataLoader worker's start ends the run."""
    proc = run_one_device(tmp_path, mode, 2)
    assert proc.returncode == watchdog.EXIT_CODE, proc.stderr[-3000:]
    assert "finished" not in proc.stdout
    line = next((text for text in proc.stderr.splitlines() if "[lightning_anyaccel]   rank 0 (pid" in text), "")
    assert where in line, proc.stderr[-3000:]
    assert "rank 0 Python stacks" in proc.stderr and stack in proc.stderr, proc.stderr[-3000:]


def test_an_evaluation_only_fabric_loop_is_progress_and_its_stall_is_not(tmp_path: Path) -> None:
    """Fabric: forwards alone (no backward, no collective) for 3 bounds keep the run alive; a stall after them ends it."""
    proc = run_one_device(tmp_path, "fabric-evaluation", 1)
    assert "evaluated" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == watchdog.EXIT_CODE, proc.stderr[-3000:]
    assert "one_device.py:13 in hang" in proc.stderr, proc.stderr[-3000:]


def test_fabric_forwards_count_compiled_ones_compile_once_and_the_module_pickles_as_it_was() -> None:
    """A set-up module's eager forward counts (Fabric reads the strategy's precision); under ``torch.compile``
    (fullgraph) a module that counts compiles once, not per call; the user's module carries nothing of ours."""
    import pickle

    import torch
    from lightning.fabric import Fabric

    from lightning_anyaccel.fabric import AnyAccelerator, AnySingleDeviceStrategy

    fabric = Fabric(accelerator=AnyAccelerator(), strategy=AnySingleDeviceStrategy(), devices=1)
    module = torch.nn.Linear(4, 1)
    wrapped = fabric.setup_module(module)
    try:
        before = watchdog._counter[0]
        wrapped(torch.ones(2, 4).to(fabric.device))
        assert watchdog._counter[0] > before
        assert b"lightning_anyaccel" not in pickle.dumps(module)
    finally:
        watchdog.disarm()

    class Counting(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            watchdog.forward_progress()
            return super().forward(x)

    graphs = []

    def backend(graph: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(Counting(4, 1), backend=backend, fullgraph=True)
    for _ in range(10):
        compiled(torch.ones(2, 4))
    assert len(graphs) == 1, f"compiled {len(graphs)} times"
