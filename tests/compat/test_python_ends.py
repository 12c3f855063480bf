"""The newest supported Python on both sides, and an Airflow side whose Python minor is not the cluster's.

A Ray head of Ray 2.60 on Python 3.13 (a cluster virtualenv of its own, as ``rayproject/ray:2.60.0-py313``), with an
S3 endpoint and the session's Airflow home (Airflow 3.3):

- Airflow 3.3 on Python 3.13 (the official image's default; an environment of its own with the provider and its
  ``ray`` extra) runs the compatibility DAG of every trainable form: an import path shipped with ``working_dir`` and a
  function and a class written in the DAG file, shipped by value (pickled on 3.13, loaded on 3.13).
- This suite's Airflow (another Python minor) runs the same DAG against the same cluster: the import path runs, the
  by-value trainables are refused before anything is written or submitted, naming both Pythons and the fixes.

(The oldest supported Python, 3.10, is the oldest Airflow's environment in tests/compat/test_older_airflow.py; a
cluster on 3.9, below the range, is refused by the engine at its start.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from tests.e2e.helpers import RUN_DAG, experiment, jobs_of
from tests.support.compat_envs import REPO_ROOT, newest_python_airflow, newest_python_cluster, unsupported_python
from tests.support.compat_stack import compat_stack

pytestmark = pytest.mark.timeout(420)

DAG_ID = "aft_ray_releases"
BY_VALUE = ("tune_function", "tune_class")

PROBE = """
import ray
from ray import tune


def train(config):
    for step in range(2):
        tune.report({"loss": float((config["x"] - 3) ** 2) + 1.0 / (step + 1), "ray_version": ray.__version__})
"""


def _python_of(python: Path) -> str:
    code = "import sys; print('{}.{}.{}'.format(*sys.version_info[:3]))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head on the newest supported Python, an S3 endpoint and the session's Airflow home; the environment
    points Ray Jobs, S3 and Airflow clients at it. Yields the cluster's Python version."""
    python = newest_python_cluster()
    working_dir = tmp_path_factory.mktemp("python-ends-probe")
    (working_dir / "release_probe.py").write_text(textwrap.dedent(PROBE))
    options = {"num_cpus": 2, "cluster_python": python, "airflow_home": os.environ["AIRFLOW_HOME"]}
    with compat_stack("Python 3.13 stack", "aft-python-ends-", **options), pytest.MonkeyPatch.context() as patch:
        patch.setenv("AFT_RELEASE_WORKING_DIR", str(working_dir))
        patch.delenv("AFT_RELEASE_MLFLOW", raising=False)
        yield _python_of(python)


def _run(python: Path | str, year: int) -> tuple[str, dict, dict, str]:
    """The DAG run by ``python`` (dag.test in a process of its own): its run id, state and task states, XComs, and
    everything it printed."""
    date = datetime(year, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(RUN_DAG), DAG_ID, date.isoformat(), "{}", "ray_releases.py"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO_ROOT,
        env=os.environ.copy(),
    )
    output = done.stdout + done.stderr
    print(f"{python}: the DAG run took {time.monotonic() - started:.1f}s")
    marked = [line.split(" ", 1) for line in output.splitlines() if line.startswith("DAG_RUN_")]
    lines = {mark: rest for mark, rest in marked}
    assert "DAG_RUN_STATE" in lines and "DAG_RUN_XCOM" in lines, output[-8000:]
    state, states = lines["DAG_RUN_STATE"].split(" ", 1)
    xcoms = json.JSONDecoder().raw_decode(lines["DAG_RUN_XCOM"])[0]
    return f"manual__{date.isoformat()}", {"state": state, "tasks": json.loads(states)}, xcoms, output


def test_airflow_on_python_313_runs_every_trainable_form_on_a_python_313_cluster(cluster: str) -> None:
    python = newest_python_airflow()
    here = _python_of(python)
    assert here.startswith("3.13.") and cluster.startswith("3.13."), (here, cluster)
    found = subprocess.run(
        [str(python), "-c", "import airflow, ray; print(airflow.__version__, ray.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found[0].startswith("3.3.") and found[1].startswith("2.60."), found

    _, run, xcoms, output = _run(python, 2005)
    assert run["state"] == "success", (run, output[-8000:])
    assert set(run["tasks"]) == {"tune_import_path", *BY_VALUE}, run
    for task_id, result in xcoms.items():
        assert set(result) == set(RESULT_KEYS), (task_id, result)
        assert result["best_config"] == {"x": 3}, (task_id, result)
        assert result["num_terminated"] == 2 and result["num_errored"] == 0, (task_id, result)
        assert result["best_metrics"]["loss"] == pytest.approx(0.5), (task_id, result)
    assert "Shipping trainable" in output  # the by-value forms were shipped by value, not by import path


def test_another_python_minor_runs_the_import_path_and_refuses_by_value_before_submitting(cluster: str) -> None:
    here = "{}.{}".format(*sys.version_info[:2])
    assert not cluster.startswith(here + "."), f"this suite's Python {here} must differ from the cluster's {cluster}"

    run_id, run, xcoms, output = _run(sys.executable, 2006)
    assert run["tasks"] == {"tune_import_path": "success", "tune_function": "failed", "tune_class": "failed"}, run
    result = xcoms["tune_import_path"]
    assert result["best_config"] == {"x": 3} and result["num_terminated"] == 2, result
    for task_id in BY_VALUE:
        assert jobs_of(experiment(DAG_ID, run_id, task_id)) == [], f"{task_id}: a Ray job was submitted"
    refusals = [line for line in output.splitlines() if "is shipped by value" in line and "pickled on Python" in line]
    assert len(refusals) >= len(BY_VALUE), output[-8000:]
    for line in refusals:
        assert f"pickled on Python {here} (this Airflow worker)" in line, line
        assert f"the cluster runs Python {cluster}" in line and "import path" in line, line
        assert "Nothing was written or submitted" in line, line


def test_the_engine_on_a_python_below_the_range_refuses_at_its_start_saying_what_it_needs() -> None:
    """A cluster on Python 3.9 (Ray 2.43 to 2.51 ship 3.9 wheels): the driver's first import, the engine package,
    ends the job with a verdict naming the Python and the range, before any module that needs 3.10 is imported.
    Run as Ray runs the entrypoint, with a bare 3.9 interpreter (nothing installed: the check needs nothing)."""
    python = unsupported_python()
    done = subprocess.run(
        [python, "-m", "airflow_tune.engine", "--spec", "s3://bucket/spec.json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert done.returncode != 0, done.stdout + done.stderr
    verdicts = [line for line in done.stdout.splitlines() if line.startswith("[airflow-tune] verdict: ")]
    assert len(verdicts) == 1, done.stdout + done.stderr
    assert _python_of(Path(python)).startswith("3.9.") and "is outside" in verdicts[0], verdicts
    assert "Python 3.10 to 3.13" in verdicts[0] and "rayproject/ray:2.60.0-py313" in verdicts[0], verdicts
    assert "ImportError: airflow-tune's engine cannot run here" in done.stderr, done.stderr[-2000:]
