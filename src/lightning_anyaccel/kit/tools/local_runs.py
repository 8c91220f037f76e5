r"""Helpers for running Lightning jobs on this machine: a free port, a child's environment, quiet logs.

The package's environment check (:mod:`lightning_anyaccel.kit.verify`), the tests, the benchmarks and
the tutorial notebooks all start processes on 127.0.0.1 and keep Lightning's per-fit info lines out
of their output, and bound every child they wait for; they take these functions from here rather
than writing them again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import warnings
from collections.abc import Iterable, Sequence

__all__ = ["child_env", "free_port", "quiet_lightning", "run_bounded"]

#: Lightning's loggers, both packages and both front ends.
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning")

#: Warnings that say nothing about the user's code (``quiet_lightning`` hides them).
KNOWN_NOISE = (
    # a data set of a few thousand samples needs no loader workers; Lightning suggests them anyway
    ".*does not have many workers.*",
    # lightning 2.6 with torch 2.13, and machines with SLURM installed
    r".*isinstance\(treespec, LeafSpec\).*",
    ".*The `srun` command is available.*",
    # a short fit with a validation_step and no validation data, on purpose (lightning_anyaccel.verify)
    ".*but have no `val_dataloader`.*",
)


def free_port() -> int:
    r"""Return a TCP port that is free on 127.0.0.1 right now.

    Returns:
        int: a port number for ``MASTER_PORT`` (or any server) of a job on this machine.

    Example::

        >>> from lightning_anyaccel.kit.tools.local_runs import free_port
        >>> 1024 <= free_port() <= 65535
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(
    threads: int = 1,
    *,
    import_paths: Iterable[str | os.PathLike[str]] = (),
    loopback: bool = False,
    **extra: object,
) -> dict[str, str]:
    r"""Return the environment for a child process: this process's, ``threads`` CPU threads, ``extra``.

    Args:
        threads: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` of the child (several ranks on one
            machine run faster with one thread each).
        import_paths: put in front of ``PYTHONPATH`` (a checkout's ``src``, for example).
        loopback: collectives stay on this machine: ``MASTER_ADDR`` defaults to ``127.0.0.1`` and
            ``GLOO_SOCKET_IFNAME`` to ``lo`` where that interface exists.
        **extra: more variables; values are turned into strings (``MASTER_PORT=free_port()``).

    Returns:
        dict[str, str]: an environment for :class:`subprocess.Popen`; ``PYTHONUNBUFFERED`` is set,
        so that the child's output arrives while it runs.

    Example::

        >>> from lightning_anyaccel.kit.tools.local_runs import child_env, free_port
        >>> env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), NODE_RANK=0)
        >>> env["OMP_NUM_THREADS"], env["NODE_RANK"]
        ('1', '0')
    """
    env = dict(os.environ)
    paths = [os.fspath(path) for path in import_paths]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    if loopback:
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        if "GLOO_SOCKET_IFNAME" not in env and _has_interface("lo"):
            env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update({key: str(value) for key, value in extra.items()})
    return env


def quiet_lightning(level: int = logging.WARNING, *, all_warnings: bool = False) -> None:
    r"""Keep Lightning's info lines ("GPU available: False", ...) and known noise out of the output.

    Args:
        level: the least severe record Lightning's loggers still show.
        all_warnings: ignore every Python warning, not only :data:`KNOWN_NOISE` (for timings).

    Example (it changes this process's logging and warning filters for good)::

        >>> from lightning_anyaccel.kit.tools.local_runs import quiet_lightning
        >>> quiet_lightning()  # doctest: +SKIP
    """
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(level)
    logging.getLogger("lightning_anyaccel").setLevel(logging.WARNING)  # its warnings stay
    if all_warnings:
        warnings.filterwarnings("ignore")
        return
    for message in KNOWN_NOISE:
        warnings.filterwarnings("ignore", message=message)


def _has_interface(name: str) -> bool:
    try:
        import psutil

        return name in psutil.net_if_addrs()
    except Exception:  # psutil missing or refused: no interface pinned
        return False


def run_bounded(
    cmd: Sequence[str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    r"""Run ``cmd`` in a session of its own, output and errors together; past ``timeout``, kill all of it.

    The whole process group (a job's workers included, stopped ones too) gets ``SIGKILL`` when the
    command runs past ``timeout`` seconds, or when the wait is interrupted (``KeyboardInterrupt``, an
    exception a signal handler raises), so nothing it started is left behind.

    Returns:
        subprocess.CompletedProcess[str]: the return code, and everything printed in ``stdout``.

    Raises:
        subprocess.TimeoutExpired: past ``timeout``, once the group is killed; its ``output`` holds
            what the command printed.

    Example::

        >>> import sys
        >>> from lightning_anyaccel.kit.tools.local_runs import run_bounded
        >>> run_bounded([sys.executable, "-c", "print('ready')"], timeout=60).stdout
        'ready\n'
    """
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out) from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
