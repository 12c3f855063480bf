"""Sphinx configuration of airflow-tune's docs: ``make docs``, and tests/packaging/test_docs.py in ``make test``,
which build them with warnings as errors (a broken include, example marker or reference fails the build).

The code examples are included from the example DAGs in ``dags/`` (``literalinclude`` between ``# [START name]`` and
``# [END name]`` comments, as the Airflow providers' docs do), so a changed DAG changes the docs. The API page
imports the Airflow side's modules (airflow, never ray, at module level), so the build needs no Ray cluster.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Importing airflow without a home of its own creates ~/airflow: give the build one beside its output.
os.environ.setdefault("AIRFLOW_HOME", str(ROOT / ".artifacts" / "docs-airflow-home"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

import airflow_tune  # noqa: E402

project = "airflow-tune"
author = "The airflow-tune authors"
copyright = "The airflow-tune authors"
version = release = airflow_tune.__version__

extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build"]
# The builtin theme: no theme package to install or pin.
html_theme = "alabaster"
html_theme_options = {"description": "Ray Tune experiments from Airflow DAGs", "fixed_sidebar": True}
html_static_path: list[str] = []
pygments_style = "sphinx"

# The classes' own docstrings; their bases are Airflow's and the package's internal mixins.
autodoc_default_options = {"members": False}
autodoc_member_order = "bysource"
# The signatures' annotations name Airflow's and Ray's types; shown in the descriptions, not resolved as links.
autodoc_typehints = "description"
