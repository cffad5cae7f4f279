"""Sphinx configuration of hpccollect's documentation site (``sphinx-build -W docs docs/_build``;
``tests/test_docs.py`` builds it with warnings as errors and runs its Python examples)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpccollect import __version__

project = "hpccollect"
author = "the hpccollect developers"
copyright = "2026, the hpccollect developers"
version = release = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_title = f"hpccollect {version}"
nitpicky = False
