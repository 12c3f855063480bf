"""The example's Ray Train trainable with Train workers the cluster cannot hold (tests/e2e/test_train_in_trial.py)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

PACKAGE = str(Path(__file__).resolve().parents[3] / "dags" / "train_in_trial")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")

with DAG("aft_train_workers_too_many", schedule=None, catchup=False, tags=["test"]) as too_many:
    # One CPU for each trial's function and two for its Train workers: three on the tests' two-CPU head.
    RayTuneOperator(
        task_id="tune",
        trainable="train_in_trial.trainables:train_driver",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"lr": 0.1, "epochs": 1, "num_workers": 2, "worker_cpus": 1},
        resources_per_trial={"cpu": 1, "train_workers": {"num_workers": 2, "per_worker": {"cpu": 1}}},
        py_modules=[PACKAGE],
        poll_interval=1.0,
        # Train would wait for its workers forever: without the feasibility check, this ends the test's run.
        execution_timeout=timedelta(seconds=90),
    )
