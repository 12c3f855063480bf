"""Two DAGs whose experiment folder a trigger conf chooses under the DAG file's root: a tail below the root
(``storage_path``) and the experiment's name, so a conf could aim one experiment into or around another."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
ONE_TRIAL = {
    "trainable": "tune_testkit.airflow_cases:stepper",
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [3]}, "steps": 2},
    "py_modules": [TESTKIT],
    "poll_interval": 0.5,
}

for dag_id in ("aft_disjoint_first", "aft_disjoint_second"):
    with DAG(
        dag_id,
        schedule=None,
        catchup=False,
        tags=["test"],
        params={"tail": Param("team-a", type="string"), "name": Param("exp", type="string")},
    ) as dag:
        RayTuneOperator(
            task_id="tune",
            storage_path=STORAGE + "/{{ params.tail }}",
            experiment_name="{{ params.name }}",
            **ONE_TRIAL,
        )
    globals()[dag_id] = dag
