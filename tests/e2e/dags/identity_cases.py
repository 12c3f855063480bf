"""Two DAGs that use one explicit experiment name, chosen by the conf with the search space: one submits and returns
at once, the other waits. Tests run them with the same name and different spaces."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")


def named(dag_id: str, **kwargs) -> DAG:
    with DAG(
        dag_id,
        schedule=None,
        catchup=False,
        tags=["test"],
        params={"name": Param("unset", type="string"), "space": Param({}, type="object")},
    ) as dag:
        RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.airflow_cases:stepper",
            storage_path=STORAGE,
            metric="loss",
            mode="min",
            experiment_name="{{ params.name }}",
            param_space="{{ params.space | tojson }}",
            py_modules=[TESTKIT],
            poll_interval=0.5,
            progress_interval_s=1.0,
            **kwargs,
        )
    return dag


named_submit = named("aft_named_submit", wait_for_completion=False)
named_blocking = named("aft_named_blocking")
