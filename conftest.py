"""The code blocks of README.md and docs/*.md are tests (Sybil): ``make test-snippets``.

Every ```python block runs, top to bottom, one namespace per file, so a block may use the
names of the blocks before it on the same page. Every ```bash block is checked without running
anything heavy: each command's program must exist, ``make`` targets must be targets of the
Makefile (``make -n``), ``python -m``/``pip install -e`` must name a module / this checkout.
Code shown from files (``literalinclude``) is not a block here: those files are run by the tests.

Blocks for hardware CI does not have (``accelerator="xpu"``, ``devices=12``) run against
simulated devices: an invisible block (an HTML/MyST comment the page does not show)
``simulate_devices("xpu", 12)`` makes this process see 12 xpu devices (``tests/fakes.py``),
enough to build every ``Trainer``/``Fabric`` of the page; ``simulate_devices(None)`` ends it.
A block that can not run anywhere here says why in a visible ``skip`` comment.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    from sybil import Sybil
    from sybil.parsers.myst import ClearNamespaceParser, CodeBlockParser, PythonCodeBlockParser, SkipParser
except ImportError:  # an environment without the docs tools (make test-compat's venvs): no snippet tests there
    Sybil = None

ROOT = Path(__file__).resolve().parent
#: pages whose code blocks are tests
SNIPPET_PAGES = ["README.md", "docs/*.md"]


def simulate_devices(device_type: str | None, count: int = 12, namespace: dict[str, Any] | None = None) -> None:
    """Make this process see ``count`` simulated ``device_type`` devices; ``None`` ends the simulation."""
    patcher = _PATCHERS.pop() if _PATCHERS else None
    if patcher is not None:
        patcher.undo()
    if device_type is None:
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes import install_fake_device

    patcher = pytest.MonkeyPatch()
    spec = __import__("lightning_anyaccel").get_spec(device_type)
    install_fake_device(patcher, device_type, count=count, backend=spec.backend)
    _PATCHERS.append(patcher)


_PATCHERS: list[pytest.MonkeyPatch] = []


_ENVIRON: list[dict[str, str]] = []


def _setup(namespace: dict[str, Any]) -> None:
    namespace["simulate_devices"] = simulate_devices
    _ENVIRON.append(dict(os.environ))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _teardown(namespace: dict[str, Any]) -> None:
    """A page leaves nothing behind: no simulated device, no process group, no variables.

    (A block that trains with DDP in this process sets ``MASTER_PORT`` & co. and keeps its
    process group's port; later tests' child processes would inherit both.)
    """
    import torch.distributed as dist

    simulate_devices(None)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    saved = _ENVIRON.pop()
    os.environ.clear()
    os.environ.update(saved)


def _makefile_targets() -> set[str]:
    out = subprocess.run(["make", "-qp", "-f", "Makefile"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return {line.split(":")[0] for line in out.stdout.splitlines()
            if line and not line.startswith(("#", "\t", ".")) and ":" in line and "=" not in line.split(":")[0]}


#: modules a page runs that live in an environment of their own (the Makefile's), by the variable naming its Python
OTHER_ENVIRONMENTS = {"litgpt": "ANYACCEL_LITGPT_PYTHON"}


def _module_exists(module: str) -> bool:
    """``module`` imports here, or in the environment of its own the Makefile gives it (LitGPT's pins)."""
    if importlib.util.find_spec(module) is not None:
        return True
    python = os.environ.get(OTHER_ENVIRONMENTS.get(module, ""), "")
    if not python or not Path(python).exists():
        return False
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", check], capture_output=True, timeout=60).returncode == 0


def check_shell_block(example: Any) -> None:
    """A ```bash block: every command names something that exists here (nothing heavy is run)."""
    problems = []
    for raw in str(example.parsed).splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = shlex.split(line)
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
            words = words[1:]
        if not words:  # only assignments
            continue
        program, args = words[0], words[1:]
        if program == "make":
            target = next((a for a in args if "=" not in a and not a.startswith("-")), "")
            if target and target not in _makefile_targets():
                problems.append(f"{line}: no target {target!r} in the Makefile")
        elif program in ("python", "python3") and args[:1] == ["-m"]:
            module = args[1]
            if module not in ("pip", "venv") and not _module_exists(module):
                problems.append(f"{line}: no module {module!r}")
        elif program in ("pip", "python") and "install" in args:
            for arg in args[args.index("install") + 1:]:
                if arg.startswith("-e") or arg == ".":
                    continue
                if arg.startswith("lightning-anyaccel") and "[" in arg:
                    extra = arg.split("[", 1)[1].rstrip("]")
                    if extra not in _pyproject_extras():
                        problems.append(f"{line}: no extra {extra!r} in pyproject.toml")
        elif program in ("conda", "apt-get", "sudo", "torchrun", "srun", "sbatch", "mpiexec", "qsub"):
            continue  # programs of other machines
        elif program in SHELL_BUILTINS:
            continue
        elif shutil.which(program) is None and not (ROOT / program).exists():
            problems.append(f"{line}: no program {program!r}")
    assert not problems, "\n".join(problems)


#: bash builtins a block may use (they are no programs on PATH)
SHELL_BUILTINS = {"export", "trap", "wait", "cd", "source", ".", "set", "unset", "kill"}


def _pyproject_extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


if Sybil is not None:
    pytest_collect_file = Sybil(
        parsers=[
            PythonCodeBlockParser(),
            CodeBlockParser(language="bash", evaluator=check_shell_block),
            SkipParser(),
            ClearNamespaceParser(),
        ],
        patterns=SNIPPET_PAGES,
        path=".",
        setup=_setup,
        teardown=_teardown,
    ).pytest()


# --- Scheduling on pytest-xdist workers (`make test` runs `pytest -n 2`) ---------------------------
#
# Most of the suite waits on child processes, launchers and browsers, so two workers share two cores
# well. Some tests must stay together on one worker, in collection order; `GROUPS` names them, and
# `pytest_xdist_make_scheduler` below sends each group to one worker as one unit. (pytest-xdist's
# own `--dist loadgroup` marks do not work with pytest 9.2: xdist 3.8 renames the test through an
# attribute pytest no longer reads.)

#: nodeid prefix -> group. A module whose module-scoped fixture is expensive (built once, on one
#: worker); the site, built from the notebooks the JupyterLab test executed (tests/test_lab.py, then
#: tests/test_site.py); one private SLURM cluster at a time. A page's code blocks (README.md,
#: docs/*.md) share one namespace, top to bottom: each page is a group of its own.
GROUPS = {
    "tests/test_lab.py": "site",
    "tests/test_site.py": "site",
    # each front end's 2-process job (the module's fixture) on a worker of its own
    "tests/test_sharding_cpu.py::test_sharded_training_matches_ddp_and_resumes[fabric": "sharding-fabric",
    "tests/test_sharding_cpu.py::test_fsdp2_builds_its_mesh_on_the_device[fabric": "sharding-fabric",
    # the one-process job (every strategy as 1 process) need not wait for the Trainer's 2-process job
    "tests/test_sharding_cpu.py::test_one_process_on_a_one_device_machine": "one-process",
    "tests/test_sharding_cpu.py": "sharding",
    "tests/test_workloads.py": "workloads",
    # the strategies' parity job (the module's fixture: one 2-process launch) on one worker
    "tests/test_parity.py::test_two_processes_reproduce_one_device": "parity",
    "tests/test_parity.py::test_bf16_mixed_matches_the_serial_bf16_run": "parity",
    "tests/test_parity.py::test_negative_controls_are_rejected": "parity",
    # DDP's spawn and fork parity job (one parent process) beside it, on a worker of its own
    "tests/test_parity.py::test_ddp_start_methods_reproduce_one_device": "parity-start-methods",
    # each front end's popen DDP job (tests/test_trainer_cpu.py's module fixture): its test, and the checkpoint test
    # that resumes the job's checkpoint
    "tests/test_trainer_cpu.py::test_ddp_two_processes[trainer-any_ddp": "popen-ddp-trainer",
    "tests/test_trainer_cpu.py::test_checkpoint_from_two_processes_resumes_on_one[trainer": "popen-ddp-trainer",
    "tests/test_trainer_cpu.py::test_ddp_two_processes[fabric-any_ddp": "popen-ddp-fabric",
    "tests/test_trainer_cpu.py::test_checkpoint_from_two_processes_resumes_on_one[fabric": "popen-ddp-fabric",
    "tests/test_release.py": "release",
    "tests/test_journeys.py::test_fsdp_by_name_under_slurm": "slurm",
    "tests/test_scaleout_launch.py::test_slurm_sbatch_and_srun": "slurm",
}
#: The longest groups first (minutes each), so that both workers are busy until the end.
LONGEST_FIRST = ["site", "sharding", "sharding-fabric", "workloads"]


def group_of(nodeid: str) -> str:
    """The group of a test: one of :data:`GROUPS`, its page, or the test alone (its nodeid).

    A prefix may end inside a test's parameters: ``test[fabric`` is the cases ``test[fabric]`` and
    ``test[fabric-...]``.

    >>> group_of("tests/test_site.py::test_internal_links_resolve"), group_of("docs/index.md::line:24,column:1")
    ('site', 'docs/index.md')
    >>> group_of("tests/test_sharding_cpu.py::test_sharded_training_matches_ddp_and_resumes[fabric-fsdp-full]")
    'sharding-fabric'
    """
    for prefix, group in GROUPS.items():
        ends = ("-", "]") if "[" in prefix else ("::", "[")
        if nodeid == prefix or nodeid.startswith(tuple(prefix + end for end in ends)):
            return group
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".md") else nodeid


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A device pass with files (``--device-pass``, tests/device_passes.py) collects only those files."""
    files = getattr(config.option, "device_pass_files", None)
    if not files:
        return None
    if collection_path.is_dir():
        return None if any(f.is_relative_to(collection_path) for f in files) else True
    return None if collection_path in files else True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest groups first (a stable sort: every worker collects the same order)."""
    def rank(item: pytest.Item) -> int:
        group = group_of(item.nodeid)
        return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, absent where it is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's scope scheduler, with :func:`group_of` as the scope (a group goes to one worker)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:  # xdist's extension point for scopes
            return group_of(nodeid)

    return GroupScheduling(config, log)
