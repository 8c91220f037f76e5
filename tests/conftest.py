"""Shared test fixtures: the device under test, subprocess runner with bounded waits, thread limits.

``pytest --device TYPE`` chooses the device the device-generic tests train on: ``cpu`` (default),
a real device type (``xpu``, ``cuda``, ``hpu``, ``npu``, ...), or ``emulated:NAME`` for the
emulated accelerator (``lightning_anyaccel.kit.emulator``) loaded as device type ``NAME`` in this process and,
through ``LIGHTNING_ANYACCEL_EMULATE`` and ``PYTHONPATH``, in every child process
(``emulated:NAME:1``: one emulated device, like a one-GPU machine). Tests marked
``device_generic`` take the device from the ``device`` fixture; ``pytest -m device_generic
--device ...`` runs only them. A test marked ``needs_devices(n)`` is skipped, saying why, where the
device under test has fewer than ``n`` devices (CPU always has enough: it runs several processes).
``--device-pass NAME`` runs a pass of ``make`` (``tests/device_passes.toml``: which test runs on which device, and
why). ``--validation-record PATH`` writes what ran where (docs/validate_hardware.md); ``--expected-skips PATH``
fails the run on a skip PATH does not list (``tests/skip_check.py``, docs/contributing.md).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
TESTS = Path(__file__).resolve().parent
AUTOLOAD = SRC / "lightning_anyaccel" / "kit" / "emulator" / "autoload"
#: Test processes skip torchmetrics' eager imports of scipy, transformers and matplotlib (lean_imports.py).
LEAN_IMPORTS = TESTS / "lean_imports"

# Child processes (popen DDP re-runs the script, spawn, helper scripts) must import this
# checkout's package, not an installed copy from another tree.
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), str(LEAN_IMPORTS),
                                            *filter(None, [os.environ.get("PYTHONPATH")])])
sys.path.insert(0, str(LEAN_IMPORTS))
import lean_imports  # noqa: E402

lean_imports.install()
os.environ.setdefault("OMP_NUM_THREADS", "1")
#: ``DS_ACCELERATOR`` as the session found it (``_no_deepspeed_accelerator_left_behind`` restores it).
SESSION_DS_ACCELERATOR = os.environ.get("DS_ACCELERATOR")


@dataclass(frozen=True)
class DeviceUnderTest:
    """The device the device-generic tests run on.

    Attributes:
        type: the ``torch.device`` type (``"cpu"``, ``"npu"``, ...).
        emulated: whether it is the emulated accelerator (``lightning_anyaccel.kit.emulator``).
        backend: the collective backend the package must pick for it.
        spec: the ``--device`` value as given.
    """

    type: str
    emulated: bool
    backend: str
    spec: str

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    @property
    def count(self) -> int:
        """How many devices of the type this machine has (CPU: unlimited processes, reported as 2 or more)."""
        from lightning_anyaccel.device import runtime
        from lightning_anyaccel.device.devices import get_spec

        return max(2, os.cpu_count() or 1) if self.is_cpu else runtime.device_count(get_spec(self.type))

    @property
    def level(self) -> str:
        """What a pass on it proves: ``hardware`` or ``emulated`` (CPU counts as hardware)."""
        return "emulated" if self.emulated else "hardware"


_DEVICE: DeviceUnderTest | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lightning-anyaccel")
    group.addoption("--device", default="cpu", metavar="TYPE",
                    help="device the device-generic tests train on: cpu (default), a device type"
                         " (xpu, cuda, hpu, npu, ...) or emulated:NAME (the emulated accelerator as NAME:"
                         " PrivateUse1 renamed, or torch's own xpu/hpu for emulated:xpu, emulated:hpu;"
                         " NAME:1 one device)")
    group.addoption("--device-pass", default=None, metavar="NAME",
                    help="run pass NAME of tests/device_passes.toml: its device (unless --device is given), marker,"
                         " files, workloads and what it leaves out, and why (make test runs its passes this way)")
    group.addoption("--validation-record", default=None, metavar="PATH",
                    help="write the run's validation record (TOML, lightning_anyaccel.kit.tools.records) to PATH")
    group.addoption("--parity-record", default=None, metavar="PATH",
                    help="replace the [parity] section of the existing record PATH with what this run's parity"
                         " tests measured (tests/validation_record.py; make records-parity)")
    group.addoption("--simulated-records", default=None, metavar="DIR",
                    help="write DIR/<type>-simulated.toml for each device type a test simulates (simulates marker)")
    group.addoption("--expected-skips", default=os.environ.get("ANYACCEL_EXPECTED_SKIPS") or None, metavar="PATH",
                    help="fail the run on a skip that PATH (tests/expected_skips.toml) does not list"
                         " (tests/skip_check.py; default: $ANYACCEL_EXPECTED_SKIPS, which make test sets)")


def _setup_device(spec: str) -> DeviceUnderTest:
    """Load the emulator or check the real device; export what child processes need."""
    if spec.startswith("emulated:"):
        emulate = spec.split(":", 1)[1]  # "npu", "npu:1" (one device), "acme:2:noshallow,memory=1GiB" (docs/emulator.md)
        from lightning_anyaccel.kit import emulator

        name, count = emulator.parse_spec(emulate)
        emulator.load(name, devices=count, options=emulator.parse_options(emulate),
                      memory_bytes=emulator.parse_memory_bytes(emulate))
        os.environ[emulator.ENV_VAR] = emulate
        os.environ["PYTHONPATH"] = os.pathsep.join([str(AUTOLOAD), os.environ["PYTHONPATH"]])
        return DeviceUnderTest(type=name, emulated=True, backend=emulator.backend_name(name), spec=spec)
    if spec == "cpu":
        return DeviceUnderTest(type="cpu", emulated=False, backend="gloo", spec=spec)
    from lightning_anyaccel.device import runtime
    from lightning_anyaccel.device.devices import get_spec
    from lightning_anyaccel.device.distributed import resolve_backend

    if not runtime.is_available(get_spec(spec)):
        raise pytest.UsageError(f"--device {spec}: PyTorch in this environment sees no {spec!r} device."
                                " Use --device cpu, or --device emulated:npu for the emulated accelerator.")
    import torch

    return DeviceUnderTest(type=spec, emulated=False, backend=resolve_backend(torch.device(spec)), spec=spec)


def pytest_configure(config: pytest.Config) -> None:
    global _DEVICE
    config.addinivalue_line("markers", "device_generic: trains on the device given by --device (run again per device)")
    config.addinivalue_line("markers", "needs_devices(n): skipped where the device under test has fewer than n devices")
    config.addinivalue_line("markers", "feature(name, ...): the support matrix feature(s) a pass of this test proves"
                                       " (tests/validation_record.py gives credit only through this marker)")
    config.addinivalue_line("markers", "simulates(device_type, feature, ...): checks the package's decisions for"
                                       " device_type with torch's device API faked (--simulated-records)")
    if config.getoption("--device-pass"):
        import device_passes

        device_passes.apply(config, config.getoption("--device-pass"))
    _DEVICE = _setup_device(config.getoption("--device"))
    if _DEVICE.emulated and not _runs_in_xdist_workers(config):
        _check_the_device_answers(config, _DEVICE)
    if config.getoption("--parity-record"):
        from validation_record import check_parity_record

        check_parity_record(Path(config.getoption("--parity-record")), _DEVICE)
    if any(config.getoption(o) for o in ("--validation-record", "--simulated-records", "--parity-record")):
        from validation_record import Collector

        config.pluginmanager.register(Collector(_DEVICE), "anyaccel-validation-record")
    if config.getoption("--expected-skips"):
        from skip_check import SkipCheck

        config.pluginmanager.register(SkipCheck(Path(config.getoption("--expected-skips")), _DEVICE.spec),
                                      "anyaccel-skip-check")


def _runs_in_xdist_workers(config: pytest.Config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers (``-n 1`` or more) instead of running them."""
    return bool(getattr(config.option, "numprocesses", None)) and "PYTEST_XDIST_WORKER" not in os.environ


def _check_the_device_answers(config: pytest.Config, device: DeviceUnderTest) -> None:
    """Run the tests in a process whose torch knows the emulated device as its accelerator. torch creates the
    XPU/HPU hooks once per process (docs/emulator.md, "The user tool and its tests") and this file's imports ask
    (``import lightning_anyaccel``), so ``emulated:xpu``/``emulated:hpu`` loaded here would fail in the first
    backward: as the pytest plugin does, the same pytest command starts again once with the device loaded at
    interpreter start (xdist workers always are); where torch still answers otherwise, a usage error says why."""
    import torch

    from lightning_anyaccel.kit import emulator
    from lightning_anyaccel.kit.emulator import pytest_plugin

    found = torch.accelerator.current_accelerator()
    if found is not None and found.type == device.type:
        return
    emulate = device.spec.split(":", 1)[1]
    if not os.environ.get(pytest_plugin._RESTARTED) and pytest_plugin._is_pytest_command():
        reason = pytest_plugin._restart_with_the_device(config, emulate)  # returns only where it can not
    else:
        reason = "it answered before the device loaded"
    raise pytest.UsageError(
        f"--device {device.spec}: torch in this process reports the accelerator {found}, not the emulated"
        f" {device.type!r} ({reason}). Run the tests in xdist workers (-n 1 or more), which load it at start, or"
        f" start pytest with {emulator.ENV_VAR}={emulate} and {emulator.AUTOLOAD} on PYTHONPATH.")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a ``needs_devices(n)`` test, naming the count, where the device under test has fewer devices."""
    marker = item.get_closest_marker("needs_devices")
    if marker is None or _DEVICE is None:
        return
    needed, found = int(marker.args[0]), _DEVICE.count
    if found < needed:
        pytest.skip(f"needs {needed} {_DEVICE.type} devices, this machine has {found}")


def pytest_report_header(config: pytest.Config) -> str:
    assert _DEVICE is not None
    kind = "emulated accelerator" if _DEVICE.emulated else "real device"
    header = f"device under test: {_DEVICE.type} ({kind}, collective backend {_DEVICE.backend})"
    if config.getoption("--device-pass"):
        import device_passes

        header += (f"\ndevice pass: {config.getoption('--device-pass')} (tests/device_passes.toml),"
                   f" WORKLOAD_CONFIGS={os.environ.get('WORKLOAD_CONFIGS')}")
        if device_passes.run_repeats():
            header += ", with the repeats make test leaves out (ANYACCEL_RUN_REPEATS=1)"
    return header


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = session.config.getoption("--validation-record")
    simulated = session.config.getoption("--simulated-records")
    collector = session.config.pluginmanager.get_plugin("anyaccel-validation-record")
    if path and _DEVICE is not None:
        from validation_record import write_record

        write_record(Path(path), _DEVICE, session, collector)
    parity = session.config.getoption("--parity-record")
    if parity and _DEVICE is not None:
        from validation_record import write_parity_record

        write_parity_record(Path(parity), _DEVICE, session, collector)
    if simulated:
        from validation_record import write_simulated_records

        write_simulated_records(Path(simulated), session, collector)


@pytest.fixture(scope="session")
def device() -> DeviceUnderTest:
    """The device under test (``--device``)."""
    assert _DEVICE is not None
    return _DEVICE


@pytest.fixture(scope="session")
def device_type(device: DeviceUnderTest) -> str:
    """The device type the device-generic tests train on (``"cpu"`` by default)."""
    return device.type


def device_under_test() -> DeviceUnderTest:
    """The device under test, for module-level code and helpers outside fixtures."""
    assert _DEVICE is not None
    return _DEVICE


#: A bound for a 2-process DDP run that only catches hangs, never a slow but correct run: a spawn run
#: takes about 20 s on an idle 2-core machine and was measured at 113-131 s on a loaded one (issue
#: #22). Kept under pytest's per-test timeout (300 s, pyproject.toml) so a hang reports the output.
DDP_TIMEOUT = 280


def run_python(args: list[str], *, timeout: float = 180, cwd: Path | None = None,
               env: dict[str, str] | None = None, python: str | Path = sys.executable) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` (this interpreter unless ``python`` names another environment's) with a hard timeout;
    on timeout the whole process group is killed (a test failure)."""
    from lightning_anyaccel.kit.tools.local_runs import (
        run_bounded,  # not at import: the device under test is set up first
    )

    try:
        return run_bounded([str(python), *args], timeout=timeout, cwd=cwd or ROOT, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as late:
        raise AssertionError(f"python {' '.join(args)} did not finish in {timeout}s:\n{(late.output or '')[-4000:]}") from None


def selected_params(request: pytest.FixtureRequest, test: str) -> list[dict[str, Any]]:
    """The parameters of each case of ``test`` (a test function of the requesting module) this run selected
    (``-k``, ``-m``, ``--deselect``, a device pass's rules): what a module's shared job has to train."""
    return [item.callspec.params for item in request.session.items
            if getattr(item, "module", None) is request.module and getattr(item, "originalname", None) == test
            and hasattr(item, "callspec")]


@pytest.fixture
def python_runner():
    """The bounded subprocess runner, as a fixture."""
    return run_python


#: The packages whose loggers carry Lightning's info lines ("GPU available: ...", the device report).
LIGHTNING_LOGGER_ROOTS = ("lightning", "pytorch_lightning", "lightning_fabric")


@pytest.fixture
def lightning_info_logs(caplog):
    """``caplog`` that sees Lightning's info lines, whatever ran before in this process.

    Lightning's ``rank_zero_info`` logs through the logger of whichever front end was imported last
    (``lightning.pytorch...`` or ``pytorch_lightning...``), and the benchmarks or ``verify`` run
    in-process raise their levels: set INFO on every Lightning logger for this test (restored after it).
    """
    loggers = logging.Logger.manager.loggerDict
    for name in sorted(set(LIGHTNING_LOGGER_ROOTS) | {n for n, logger in loggers.items()
                                                       if isinstance(logger, logging.Logger)
                                                       and n.split(".")[0] in LIGHTNING_LOGGER_ROOTS}):
        caplog.set_level(logging.INFO, logger=name)
    return caplog


def rank_device(device: DeviceUnderTest, rank: int) -> str:
    """The device local rank ``rank`` trains on: ``<type>:<rank>``, or ``<type>:0`` where each process sees
    only its own card (``process_device_env`` in the device table: Gaudi); ``cpu`` on CPU."""
    from lightning_anyaccel.device.devices import get_spec

    if device.is_cpu:
        return "cpu"
    return f"{device.type}:{0 if get_spec(device.type).process_device_env else rank}"


#: Where Lightning keeps the rank its ``rank_zero_*`` functions compare with (one attribute per module).
RANK_ZERO_MODULES = ("lightning_utilities.core.rank_zero", "lightning.fabric.utilities.rank_zero",
                     "lightning.pytorch.utilities.rank_zero", "lightning_fabric.utilities.rank_zero",
                     "pytorch_lightning.utilities.rank_zero")


@pytest.fixture(autouse=True)
def _rank_zero_restored():
    """Each test leaves Lightning's process-wide rank as it found it.

    A Trainer or Fabric built in-process with a cluster environment (the launcher and Gaudi tests
    build them as rank 1, 3 or 7) sets ``rank_zero_only.rank`` to that environment's global rank for
    the whole process; every later test on the same pytest worker would then lose what Lightning
    writes and logs on rank zero only (metrics files, info lines).
    """
    held = [(module, module.rank_zero_only.rank) for module in map(sys.modules.get, RANK_ZERO_MODULES)
            if module is not None and hasattr(getattr(module, "rank_zero_only", None), "rank")]
    yield
    for module, rank in held:
        module.rank_zero_only.rank = rank


@pytest.fixture(autouse=True)
def _stall_watchdog_disarmed():
    """Each test leaves the stall watchdog of this process disarmed.

    A Fabric run built in-process (one device or a fork) arms it until the process ends; the pytest
    worker would then be ended as stalled once it has run other tests longer than the bound.
    """
    yield
    from lightning_anyaccel.cluster import watchdog

    watchdog.disarm()


@pytest.fixture(autouse=True)
def _no_deepspeed_accelerator_left_behind(monkeypatch):
    """Each test starts with the ``DS_ACCELERATOR`` the session started with, and leaves it so.

    A DeepSpeed strategy sets ``DS_ACCELERATOR`` in ``os.environ`` for the processes its launcher
    starts (``strategies/sharding.py``); left behind, a later test's job on another device type
    inherits it and is refused, as a user's conflicting choice is.
    """
    monkeypatch.setenv("DS_ACCELERATOR", "")  # records the original state, restored after the test
    if SESSION_DS_ACCELERATOR is None:
        monkeypatch.delenv("DS_ACCELERATOR")
    else:
        monkeypatch.setenv("DS_ACCELERATOR", SESSION_DS_ACCELERATOR)
