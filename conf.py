"""Sphinx configuration of the lightning-anyaccel documentation (``make docs``).

The source directory is the repository root, so that the notebooks in ``notebooks/`` are pages
of the site as they are; ``include_patterns`` keeps Sphinx to ``docs/`` and ``notebooks/``.
The notebooks are executed on every build (``nbsphinx_execute = "always"``); a cell that fails
fails the build, and so does any warning (``make docs`` passes ``-W``).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import lightning_anyaccel  # noqa: E402

# nbsphinx converts markdown cells with the pandoc binary; PyPI's pypandoc-binary ships one.
if shutil.which("pandoc") is None:
    try:
        import pypandoc

        os.environ["PATH"] = os.path.dirname(pypandoc.get_pandoc_path()) + os.pathsep + os.environ["PATH"]
    except (ImportError, OSError):
        pass  # nbsphinx then says PandocMissing, which names the fix

project = "lightning-anyaccel"
author = "lightning-anyaccel contributors"
copyright = "2026, lightning-anyaccel contributors"
release = version = lightning_anyaccel.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.extlinks",
    "myst_parser",
    "nbsphinx",
    "sphinx_copybutton",
    "anyaccel_docs",
]

root_doc = "docs/index"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
include_patterns = ["docs/**", "notebooks/*.ipynb"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "notebooks/runs/**", "docs/_ext/**"]

# ---- markdown --------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# ---- notebooks -------------------------------------------------------------------------------
nbsphinx_execute = "always"
nbsphinx_allow_errors = False
nbsphinx_timeout = 400            # per cell; a notebook's own metadata may set another
nbsphinx_kernel_name = "python3"  # the interpreter running Sphinx (the project's environment)
nbsphinx_requirejs_path = ""      # no widgets here; RequireJS only clashes with the theme's scripts
nbsphinx_assume_equations = False # no MathJax from a CDN on notebook pages: the site works offline
nbsphinx_prolog = """
.. note::

   This page is the notebook ``{{ env.docname }}.ipynb``, executed when this site was built. Run it
   yourself with ``make lab`` (or ``jupyter lab notebooks/``); test it with ``pytest --nbmake notebooks/``.
"""

# ---- API reference ---------------------------------------------------------------------------
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False     # Lightning's own docstrings are documented by Lightning
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

# ---- links out (no intersphinx: the docs build runs without network) ------------------------
extlinks = {
    "torch": ("https://docs.pytorch.org/docs/stable/%s", "%s"),
    "lightning": ("https://lightning.ai/docs/pytorch/stable/%s", "%s"),
    "gh": ("https://github.com/%s", "%s"),
}

# ---- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"lightning-anyaccel {release}"
html_static_path = ["docs/_static"]
html_css_files = ["anyaccel.css"]
html_copy_source = False
html_show_sourcelink = False
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
