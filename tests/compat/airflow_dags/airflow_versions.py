"""DAGs the compatibility tier runs under an older Airflow's real processes, with no Ray on the Airflow side.

The trainable is an import path of code that lives on the cluster: the test cluster is this machine, so the job's
``PYTHONPATH`` names the test kit's folder and nothing is shipped from Airflow.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

ON_THE_CLUSTER = str(Path(__file__).resolve().parents[2] / "support")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
SPACE = {"x": {"grid_search": [1, 3]}, "steps": 2}


def _tune(task_id: str, deferrable: bool, param_space: object = SPACE) -> RayTuneOperator:
    return RayTuneOperator(
        task_id=task_id,
        trainable="tune_testkit.airflow_cases:stepper",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space=param_space,
        resources_per_trial={"cpu": 0.5},
        runtime_env={"env_vars": {"PYTHONPATH": ON_THE_CLUSTER}},
        progress_interval_s=1.0,
        poll_interval=0.5,
        stop_wait_s=20,
        deferrable=deferrable,
    )


with DAG("aft_compat_modes", schedule=None, catchup=False, tags=["test"]) as modes:
    _tune("blocking", deferrable=False)
    _tune("deferred", deferrable=True)

with DAG(
    "aft_compat_kill",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"space": Param(SPACE, type="object")},
) as kill:
    _tune("deferred", deferrable=True, param_space="{{ params.space | tojson }}")
