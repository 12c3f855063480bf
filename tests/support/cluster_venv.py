"""Where the separate cluster virtualenv is (``make cluster-venv``; ``AIRFLOW_TUNE_CLUSTER_PYTHON`` overrides it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_PYTHON = Path(os.environ.get("AIRFLOW_TUNE_CLUSTER_PYTHON", REPO_ROOT / ".cluster-venv" / "bin" / "python"))


def cluster_python() -> Path:
    """The cluster virtualenv's Python; fails the test (never skips it) when the virtualenv was not built."""
    if not os.access(CLUSTER_PYTHON, os.X_OK):
        pytest.fail(f"no cluster virtualenv at {CLUSTER_PYTHON.parent.parent}: build it with `make cluster-venv`")
    return CLUSTER_PYTHON
