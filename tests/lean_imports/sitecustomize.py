"""Install :mod:`lean_imports` in every process started with this folder on ``PYTHONPATH``.

Python imports only the first ``sitecustomize`` on ``sys.path``, so this one then runs the next one
(e.g. the emulator's, ``src/lightning_anyaccel/kit/emulator/autoload/``, or a site's own).
"""

import importlib.machinery
import importlib.util
import os
import sys

import lean_imports

lean_imports.install()

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
