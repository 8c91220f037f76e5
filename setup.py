"""Builds the package with its start-up hook, ``lightning_anyaccel_startup.pth`` (everything else: pyproject.toml).

Python runs the one line of a ``.pth`` file in ``site-packages`` at every start-up. The hook's line
only reads ``LIGHTNING_ANYACCEL_ACTIVATE`` and, when it is set, arms ``_lightning_anyaccel_startup``
(``src/_lightning_anyaccel_startup.py``), which imports the package once Lightning is imported.

setuptools puts only package files into a wheel, so the file is copied to the wheel's root here:
into ``build_lib`` for wheels (``pip install .``, ``python -m build``), and, for an editable install
(``pip install -e .``, whose wheel holds only a ``.pth`` pointing at ``src/``), into the directory
setuptools installs the editable wheel's files from.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = Path("src", "lightning_anyaccel_startup.pth")


class BuildWithStartupHook(build_py):
    """``build_py`` that also puts :data:`HOOK` at the root of the installed files."""

    def run(self) -> None:
        super().run()
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(str(HOOK), str(Path(root, HOOK.name)), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib, HOOK.name))]


setup(cmdclass={"build_py": BuildWithStartupHook})
