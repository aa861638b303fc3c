"""Sphinx configuration of arpo's documentation: MyST Markdown pages, the Furo theme, and API pages generated from
the docstrings (which are Markdown) by sphinx-autodoc2. Build: sphinx-build -W -b html docs docs/_build/html"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "arpo"
author = "the arpo developers"
copyright = "2026, the arpo developers"
release = "0.1.0"

extensions = ["myst_parser", "autodoc2", "arpo_pages"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

autodoc2_packages = [
    {"path": "../arpo_env", "auto_mode": False},
    {"path": "../arpo_algo", "auto_mode": False},
]
autodoc2_docstring_parser_regexes = [(r".*", "myst")]
autodoc2_render_plugin = "myst"
autodoc2_hidden_objects = ["private", "dunder", "inherited"]

html_theme = "furo"
html_title = "arpo"
html_static_path = ["_static"]

suppress_warnings = ["myst.header"]  # the docstrings' own headings (## Description …) start below the page's title
