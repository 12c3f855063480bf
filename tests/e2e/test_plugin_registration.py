"""The Experiment view's plugin is registered once in every Airflow process: a real ``airflow plugins`` process, with
its logs on (``--verbose``), loads it with its external view and FastAPI app and logs no "already registered" line.

Two ways to start Airflow are checked: ``python -m airflow`` from the repository root, which puts the checkout on
``sys.path`` as pytest, ``tests/e2e/run_dag.py`` and any ``python -m`` run in the checkout do, and the ``airflow``
command from an Airflow home, as the real scheduler, triggerer, dag processor and API server start in the e2e tests.
A second copy of airflow-tune's metadata on ``sys.path`` (the ``airflow_tune.egg-info`` that setuptools leaves in the
checkout on ``pip install -e .``) makes Airflow see the ``airflow.plugins`` entry point twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "airflow_tune_experiment_view"


def _environment(home: Path) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AIRFLOW_CONFIG", "PYTHONPATH") and not k.startswith(("PYTEST_", "AIRFLOW__", "AIRFLOW_CONN_"))
    }
    return {
        **base,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }


def _copies_of_our_metadata() -> list[str]:
    """Where the distributions named airflow-tune that a process started in the checkout sees are."""
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlib import metadata; "
            "print('\\n'.join(str(getattr(d, '_path', d)) for d in metadata.distributions(name='airflow-tune')))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return found.stdout.split()


@pytest.mark.parametrize("started", ["python -m airflow, in the checkout", "airflow, in its home"])
def test_the_experiment_view_is_registered_once(tmp_path, started):
    home = tmp_path / "home"
    home.mkdir()
    if started.startswith("python -m"):
        args, cwd = [sys.executable, "-m", "airflow"], REPO
    else:
        args, cwd = [shutil.which("airflow", path=str(Path(sys.executable).parent)) or "airflow"], home
    result = subprocess.run(
        [*args, "plugins", "--verbose", "--output", "json"],
        cwd=cwd,
        env=_environment(home),
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"airflow plugins ({started}) exited with {result.returncode}:\n{output[-3000:]}"

    twice = [line for line in output.splitlines() if "already registered" in line]
    assert not twice, (
        f"airflow plugins ({started}) registered a plugin twice: {twice}; airflow-tune's metadata as a process in the "
        f"checkout sees it: {_copies_of_our_metadata()} (one copy expected, in the virtualenv's site-packages). "
        f"Remove {REPO / 'airflow_tune.egg-info'}, which `pip install -e .` leaves there (make venv removes it)."
    )

    listed = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert listed, f"airflow plugins ({started}) printed no JSON list of plugins:\n{result.stdout[-3000:]}"
    plugins = {plugin["name"]: plugin for plugin in json.loads(listed[-1])}
    assert PLUGIN in plugins, f"{PLUGIN} is not loaded ({started}); loaded: {sorted(plugins)}"
    ours = plugins[PLUGIN]
    assert [view["url_route"] for view in ours["external_views"]] == ["airflow-tune-experiment"]
    assert ours["external_views"][0]["destination"] == "task_instance"
    assert [app["url_prefix"] for app in ours["fastapi_apps"]] == ["/airflow-tune"]
    assert "airflow-tune==" in ours["source"] and "airflow.plugins" in ours["source"]


def test_one_copy_of_our_metadata_is_installed():
    """The entry points Airflow reads come from one distribution: the virtualenv's (``make venv``)."""
    copies = [str(getattr(d, "_path", d)) for d in metadata.distributions(name="airflow-tune")]
    assert len(copies) == 1, (
        f"airflow-tune's metadata is on sys.path {len(copies)} times: {copies}; every Airflow process started with "
        f"the checkout on sys.path would register its plugin twice. Remove {REPO / 'airflow_tune.egg-info'} "
        "(make venv does)."
    )
