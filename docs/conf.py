"""Sphinx configuration of esmjac's documentation (``make docs``; built by
the tests with warnings as errors: ``tests/docs/test_docs.py``)."""
from __future__ import annotations

project = "esmjac"
author = "esmjac developers"
# napoleon renders the numpydoc sections (Parameters, Returns, Raises) of
# the public factories; Google-style parsing is off (no other docstring is).
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"          # the signatures carry them; keep the pages short
autodoc_default_options = {"members": True, "undoc-members": False}
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = False
suppress_warnings: list = []
