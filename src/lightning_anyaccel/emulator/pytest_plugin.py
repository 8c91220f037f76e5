"""A pytest plugin: your tests on an emulated accelerator, on any CPU machine.

Enable it in your ``conftest.py`` with one line::

    pytest_plugins = ["lightning_anyaccel.emulator.pytest_plugin"]

Then the session fixture ``emulated_device`` is a ``torch.device`` of the emulated type (``npu`` with 2
devices unless ``--emulate NAME[:DEVICES[:memory=SIZE]]`` or the ini option ``emulate`` says otherwise),
loaded in the test process and in every process it starts (DDP ranks). A process hosts one emulated
device type, so a session has one. See docs/emulate.md.
"""

from __future__ import annotations

import pytest
import torch


def pytest_addoption(parser: pytest.Parser) -> None:
    help_text = "the emulated device of the emulated_device fixture: NAME[:DEVICES[:memory=SIZE]] (default npu:2)"
    parser.addoption("--emulate", default=None, metavar="SPEC", help=help_text)
    parser.addini("emulate", help=help_text, default="npu:2")


@pytest.fixture(scope="session")
def emulated_device(pytestconfig: pytest.Config) -> torch.device:
    """The emulated device (``torch.device``), loaded for this session and the processes it starts."""
    from lightning_anyaccel.emulator import emulate, parse_memory_bytes, parse_spec

    spec = pytestconfig.getoption("--emulate") or str(pytestconfig.getini("emulate"))
    name, devices = parse_spec(spec)
    memory = parse_memory_bytes(spec)
    return emulate(name, devices=devices, memory=memory)
