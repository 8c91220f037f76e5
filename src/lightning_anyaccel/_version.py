"""The package version: its one source.

``pyproject.toml`` reads it (``[tool.setuptools.dynamic]``, without importing the package) for the
sdist and wheel metadata, and ``lightning_anyaccel.__version__`` re-exports it.
"""

__version__ = "0.1.0"
