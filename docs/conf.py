"""Sphinx configuration of Tarantella's manual (built with -W by tests/docs/test_manual.py)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))

project = "Tarantella for Keras 3"
author = "the Tarantella for Keras 3 developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "help_text"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = project
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
