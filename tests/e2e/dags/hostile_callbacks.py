"""DAGs whose Tune logger sends to a tracking server: one takes its callbacks from the trigger conf (so a conf could
choose where the cluster sends its data and the nodes' MLflow token), one names the server in the DAG file itself.

The DAG file's server is read from ``AFT_E2E_TRACKING_LISTENER`` when the file is parsed: a constant of the DAG file,
as a deployment's DAG file would write it (the test starts a listener and sets it first)."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
LISTENER = os.environ.get("AFT_E2E_TRACKING_LISTENER", "http://127.0.0.1:9")
ONE_TRIAL = {
    "trainable": "tune_testkit.airflow_cases:stepper",
    "storage_path": STORAGE,
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [1]}, "steps": 1},
    "py_modules": [TESTKIT],
    "poll_interval": 0.5,
}

with DAG(
    "aft_callbacks_from_conf",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"callbacks": Param(["csv"], type="array")},
) as callbacks_from_conf:
    RayTuneOperator(task_id="tune", callbacks="{{ params.callbacks | tojson }}", **ONE_TRIAL)

with DAG("aft_callbacks_written", schedule=None, catchup=False, tags=["test"]) as callbacks_written:
    RayTuneOperator(
        task_id="tune",
        callbacks=[{"name": "mlflow", "args": {"tracking_uri": LISTENER, "experiment_name": "aft-e2e"}}],
        **ONE_TRIAL,
    )
