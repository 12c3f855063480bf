"""Where the compatibility tier's environments are (``make compat-envs``; the Makefile passes their paths)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPAT_DIR = Path(os.environ.get("AIRFLOW_TUNE_COMPAT_DIR", REPO_ROOT / ".compat"))
#: The Ray releases with a cluster virtualenv of their own, oldest first.
RAY_RELEASES = os.environ.get("AIRFLOW_TUNE_COMPAT_RAY", "2.43.0 2.50.1").split()
#: The older supported Airflow releases with an environment of their own, oldest first (3.3 is the main venv's).
AIRFLOW_RELEASES = os.environ.get("AIRFLOW_TUNE_COMPAT_AIRFLOW", "3.1.8 3.2.2").split()
#: The oldest supported Airflow.
AIRFLOW_RELEASE = AIRFLOW_RELEASES[0]


def _python(folder: str) -> Path:
    python = COMPAT_DIR / folder / "bin" / "python"
    if not (COMPAT_DIR / folder / ".installed").exists() or not os.access(python, os.X_OK):
        pytest.fail(f"no compatibility environment at {python.parent.parent}: build it with `make compat-envs`")
    return python


def ray_cluster_python(release: str) -> Path:
    """The Python of the cluster virtualenv of Ray ``release``; fails the test (never skips) when it was not built."""
    return _python(f"ray-{release}")


def airflow_python(release: str = AIRFLOW_RELEASE) -> Path:
    """The Python of an older Airflow's environment (the provider without its ``ray`` extra), the oldest's by
    default."""
    return _python(f"airflow-{release}")


#: The oldest supported Ray on the Airflow side, in an environment of the newest supported Airflow.
SIDE_RAY_RELEASE = os.environ.get("AIRFLOW_TUNE_COMPAT_SIDE_RAY", "2.43.0")


def airflow_side_ray_python() -> Path:
    """The Python of the Airflow environment whose Ray (the provider's ``ray`` extra) is the oldest supported one."""
    return _python(f"airflow-side-ray-{SIDE_RAY_RELEASE}")


def newest_python_airflow() -> Path:
    """The Python of the environment of the newest supported Airflow on the newest supported Python (3.13), with the
    provider and its ``ray`` extra."""
    return _python("airflow-python-3.13")


def newest_python_cluster() -> Path:
    """The Python of the cluster virtualenv of the newest supported Ray on the newest supported Python (3.13)."""
    return _python("ray-python-3.13")


def unsupported_python() -> str:
    """A Python below the supported range (3.9, from pyenv; the Makefile passes its path); fails the test when
    absent."""
    import shutil

    python = os.environ.get("AIRFLOW_TUNE_COMPAT_UNSUPPORTED_PYTHON") or "python3.9"
    found = shutil.which(python) or (python if os.access(python, os.X_OK) else None)
    if not found:
        pytest.fail(f"no Python 3.9 at {python!r}: install one (pyenv install 3.9) or set COMPAT_UNSUPPORTED_PYTHON")
    return found
