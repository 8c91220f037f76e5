"""A pytest plugin: your tests on an emulated accelerator, on any CPU machine.

Enable it in your ``conftest.py`` with one line::

    pytest_plugins = ["lightning_anyaccel.kit.emulator.pytest_plugin"]

When pytest starts (``pytest_configure``, before your test files are imported), the plugin gives the
test process the emulated device named by ``--emulate NAME[:DEVICES[:memory=SIZE]]`` or the ini option
``emulate`` (default ``npu:2``), and every process it starts (DDP ranks, which run pytest again; spawn
children): it compiles the device if needed, then starts the same pytest command again, once, with the
device loaded at interpreter start (``LIGHTNING_ANYACCEL_EMULATE`` and the autoload folder, what
``python -m lightning_anyaccel.emulate`` does). Loading before anything else matters: torch answers once
per process which accelerator the machine has, and importing ``lightning_anyaccel`` asks it. The session
fixture ``emulated_device`` is the ``torch.device`` of that type; where the device could not be had,
each test that asks for it fails with the reason (it never runs on the CPU). A bad ``--emulate`` ends
pytest before any test runs, naming what is wrong. See docs/emulate.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

_HELP = "the emulated device of the emulated_device fixture: NAME[:DEVICES[:memory=SIZE]] (default npu:2)"
#: The loaded device, or why it could not be loaded.
_DEVICE = pytest.StashKey["torch.device | str"]()
#: Set in the pytest command the plugin started again: it starts no third one.
_RESTARTED = "LIGHTNING_ANYACCEL_PYTEST_RESTARTED"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--emulate", default=None, metavar="SPEC", help=_HELP)
    parser.addini("emulate", help=_HELP, default="npu:2")


def _spec(config: pytest.Config) -> str:
    return str(config.getoption("--emulate") or config.getini("emulate")).strip()


def pytest_configure(config: pytest.Config) -> None:
    """Check the spec (a bad one is a usage error) and load the device before any test file is imported."""
    from lightning_anyaccel.kit.emulator import check_spec

    spec = _spec(config)
    try:
        name, count, options, memory = check_spec(spec)
    except ValueError as err:
        raise pytest.UsageError(f"--emulate {spec}: {err}") from None
    from lightning_anyaccel.kit.emulator import loaded_name

    if loaded_name() is None and not os.environ.get(_RESTARTED) and _is_pytest_command():
        reason = _restart_with_the_device(config, spec)  # returns only where the device can not be built
        config.stash[_DEVICE] = reason
        return
    config.stash[_DEVICE] = _load(spec, name, count, options, memory)


def _is_pytest_command() -> bool:
    """Whether this process is a ``pytest``/``python -m pytest`` command (not ``pytest.main()`` in a program)."""
    script = Path(sys.argv[0])
    return script.name in ("pytest", "py.test") or (script.name == "__main__.py" and script.parent.name == "pytest")


def _restart_with_the_device(config: pytest.Config, spec: str) -> str:
    """Compile the device here (a failure is the tests' reason), then run this pytest command again with the
    device loaded at interpreter start; returns the reason where it can not."""
    from lightning_anyaccel.kit.emulator import AUTOLOAD, ENV_VAR
    from lightning_anyaccel.kit.emulator.build import build

    try:
        build()
    except Exception as err:
        return f"--emulate {spec}: the emulated device could not be built: {type(err).__name__}: {err}"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ.update({ENV_VAR: spec, _RESTARTED: "1", "PYTHONPATH": os.pathsep.join([str(AUTOLOAD), *paths])})
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()  # the new pytest writes to the terminal, not to this one's capture files
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def _load(spec: str, name: str, count: int, options: frozenset[str], memory: int | None) -> torch.device | str:
    """The emulated device, loaded here and exported to child processes; or the reason it is not there."""
    from lightning_anyaccel.kit.emulator import emulate

    try:
        device = emulate(name, devices=count, memory=memory, options=options)
        import lightning_anyaccel  # noqa: F401  (registers the device's name with Lightning, in DDP ranks too)
    except Exception as err:
        return f"--emulate {spec}: the emulated device could not be loaded in this test process: {type(err).__name__}: {err}"
    return device


def pytest_report_header(config: pytest.Config) -> str:
    state = config.stash.get(_DEVICE, None)
    return f"emulated device: {_spec(config)}" if isinstance(state, torch.device) else f"emulated device: none ({state})"


@pytest.fixture(scope="session")
def emulated_device(pytestconfig: pytest.Config) -> torch.device:
    """The emulated device (``torch.device``), loaded for this session and the processes it starts."""
    state = pytestconfig.stash[_DEVICE]
    if isinstance(state, str):
        pytest.fail(state, pytrace=False)
    return state
