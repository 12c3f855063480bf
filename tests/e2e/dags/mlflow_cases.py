"""DAGs of the MLflow tracking tests (tests/integration/test_mlflow_tracking.py): a RayTuneOperator whose
``mlflow_tracking`` is rendered from the run's conf, against the MLflow connection each DAG names."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
DEFAULT_SPACE = {"x": {"grid_search": [1, 3]}, "steps": 3}


def _dag(dag_id: str, conn_id: str) -> DAG:
    params = {"space": Param(DEFAULT_SPACE, type="object"), "tracking": Param({"tags": {"team": "ml"}}, type="object")}
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"], params=params) as dag:
        RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.airflow_cases:stepper",
            storage_path=STORAGE,
            metric="loss",
            mode="min",
            param_space="{{ params.space | tojson }}",
            checkpoint={"num_to_keep": 2},
            py_modules=[TESTKIT],
            progress_interval_s=1.0,
            poll_interval=0.5,
            mlflow_tracking="{{ params.tracking | tojson }}",
            mlflow_conn_id=conn_id,
        )
    return dag


tracked = _dag("aft_mlflow_tracked", "mlflow_default")
# Connections the tests set in the environment: the stack's server with a password (which its server ignores),
# an address where nothing listens, and a server that answers 403.
with_secret = _dag("aft_mlflow_secret", "mlflow_secret")
unreachable = _dag("aft_mlflow_unreachable", "mlflow_unreachable")
refusing = _dag("aft_mlflow_refusing", "mlflow_refusing")
