r"""What the tutorial notebooks use and do not teach: the set-up, tables, bounded child processes, showing code.

The notebooks (``notebooks/`` in the repository, the Tutorial pages of the site) import these instead
of each writing the same helpers again: ``start``/``finish`` (:mod:`lightning_anyaccel.kit.tutorial.session`)
open and close every notebook, ``say`` writes a sentence from a run's results; the data and the model they share are in
:mod:`lightning_anyaccel.kit.tutorial.digits`, and the training script notebooks 3 and 4 launch is
:mod:`lightning_anyaccel.kit.tutorial.train_digits`. Nothing here is imported by
``import lightning_anyaccel``; the notebooks' one install line is
``pip install "lightning-anyaccel[tutorial]"`` (scikit-learn and matplotlib).

Example::

    >>> from lightning_anyaccel.kit.tutorial import html_table
    >>> print(html_table([("xpu", 2)], ["device", "count"]).data)  # doctest: +NORMALIZE_WHITESPACE
    <table class="anyaccel-table"><thead><tr><th>device</th><th>count</th></tr></thead><tbody><tr><td>xpu</td><td>2</td></tr></tbody></table>
"""

from __future__ import annotations

import html
import inspect
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_anyaccel.kit.tools.local_runs import child_env, free_port, quiet_lightning
from lightning_anyaccel.kit.tutorial.session import finish, say, start

__all__ = ["child_env", "copy_script", "finish", "free_port", "html_table", "quiet_lightning", "run_script",
           "run_together", "say", "show_file", "show_source", "start"]

#: The folder of the tutorial's scripts (``train_digits.py``): part of the installed package.
HERE = Path(__file__).resolve().parent


def html_table(rows: Iterable[Sequence[object]], header: Sequence[object]) -> Any:
    """An HTML table for Jupyter (and the documentation site) from plain rows."""
    from IPython.display import HTML

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return HTML(f'<table class="anyaccel-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def show_source(obj: object) -> Any:
    """The source of a class, a function or a module of the tutorial, highlighted, for a notebook.

    The code a notebook teaches is shown where it is taught, and written once, here.
    """
    from IPython.display import Code

    if isinstance(obj, (str, Path)):
        return Code(Path(obj).read_text(), language="python")
    return Code(inspect.getsource(obj), language="python")  # type: ignore[arg-type]


def show_file(path: str | os.PathLike[str], language: str = "bash") -> Any:
    """A file as it is on disk, highlighted, for a notebook (a launch script: one copy, shown where it is used)."""
    from IPython.display import Code

    return Code(Path(path).read_text(), language=language)


def copy_script(name: str, folder: str | os.PathLike[str] = ".") -> Path:
    """Copy the tutorial file ``name`` (``"train_digits.py"``, ``"launch/torchrun.sh"``) into ``folder``.

    A launcher on a cluster starts a file, not a module: the notebooks copy the script next to them,
    where you can change it. ``launch/`` holds the repository's launch scripts (``scripts/launch/``,
    which the scale-out tests run), shipped with the package. Returns the copy's path.
    """
    target = Path(folder) / name
    source = HERE / name
    if not source.is_file():
        raise FileNotFoundError(f"no tutorial file {name!r} in {HERE}")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    shutil.copymode(source, target)  # a launch script stays executable
    return target


def run_script(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None) -> str:
    """Run ``cmd`` and return what it printed; raise with its output when it fails or runs past ``timeout``.

    The whole process group is killed past the timeout (:func:`~lightning_anyaccel.kit.tools.local_runs.run_bounded`).
    """
    from lightning_anyaccel.kit.tools.local_runs import run_bounded

    try:
        done = run_bounded(cmd, timeout=timeout, env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"{list(cmd)} did not finish in {timeout} s:\n{str(err.output)[-3000:]}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{list(cmd)} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def run_together(jobs: Mapping[str, tuple[Sequence[str], Mapping[str, str]]], *, timeout: float,
                 log_dir: Path) -> dict[str, str]:
    """Start several commands at once (one per "node"), each logging to its ``NAME.log``.

    Waits at most ``timeout`` seconds for all; on a timeout or a failure every process group is killed
    and the logs are shown in the error. Returns the logs by name.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    files = {}
    for name, (cmd, env) in jobs.items():
        files[name] = open(log_dir / f"{name}.log", "w")
        procs[name] = subprocess.Popen(list(cmd), env=dict(env), stdout=files[name], stderr=subprocess.STDOUT,
                                       start_new_session=True)
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for name, proc in procs.items():
            try:
                code: int | None = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                failed.append(f"{name}: {'timed out' if code is None else f'exit code {code}'}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for handle in files.values():
            handle.close()
    logs = {name: (log_dir / f"{name}.log").read_text() for name in jobs}
    if failed:
        shown = "\n".join(f"--- {name}.log\n{text[-2000:]}" for name, text in logs.items())
        raise RuntimeError(f"{'; '.join(failed)}\n{shown}")
    return logs
