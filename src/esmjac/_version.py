"""The package version, its one source: ``pyproject.toml`` reads it
(``[tool.setuptools.dynamic]``); a leaf module, so the generator header and
the cache keys read it without importing the whole public surface."""

__version__ = "0.1.0"
