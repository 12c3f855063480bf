"""DAGs whose storage path a trigger conf chooses, in part (a templated tail under the DAG file's root) or whole (a
deployment root must admit it), and one on a shared filesystem (a ``file://`` folder every node of the local stack
sees)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
#: A folder beside the test session's Airflow home (the stack's nodes run on this machine: a shared filesystem).
FILE_STORAGE = "file://" + str(
    Path(os.environ.get("AIRFLOW_HOME", tempfile.gettempdir())).resolve().parent / "file-storage" / "experiments"
)
ONE_TRIAL = {
    "trainable": "tune_testkit.airflow_cases:stepper",
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [3]}, "steps": 2},
    "py_modules": [TESTKIT],
    "poll_interval": 0.5,
}

with DAG(
    "aft_storage_team_tail",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"team": Param("team-a", type="string")},
) as team_tail:
    # The README's form: the DAG file writes the root, a conf chooses the team folder below it.
    RayTuneOperator(task_id="tune", storage_path=STORAGE + "/{{ params.team }}", **ONE_TRIAL)

with DAG(
    "aft_storage_from_conf",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"path": Param(STORAGE, type="string")},
) as from_conf:
    # No root in the DAG file: only a deployment root (allowed_storage_roots) can admit the rendered path.
    RayTuneOperator(task_id="tune", storage_path="{{ params.path }}", **ONE_TRIAL)

with DAG("aft_storage_file", schedule=None, catchup=False, tags=["test"]) as on_a_shared_filesystem:
    RayTuneOperator(task_id="tune", storage_path=FILE_STORAGE, **ONE_TRIAL)

with DAG(
    "aft_storage_mapped_from_xcom",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"path": Param(STORAGE, type="string")},
) as mapped_from_xcom:
    # A mapped task is built with its expanded values as arguments: one taken from an XCom is still data.
    @task
    def choose(params=None) -> list[str]:
        return [params["path"]]

    RayTuneOperator.partial(task_id="tune", **ONE_TRIAL).expand(storage_path=choose())
