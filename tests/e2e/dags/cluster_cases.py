"""DAGs of the multi-node cluster tests (tests/e2e/test_cluster.py): no retries, so a lost node must be survived by
the experiment itself, inside one try of the task."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")

with DAG(
    "aft_cluster_node_loss",
    schedule=None,
    catchup=False,
    tags=["test"],
    default_args={"retries": 0},
    params={"space": Param({"x": {"grid_search": [1, 2]}}, type="object")},
) as node_loss:
    RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.nodes:checkpointing",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space="{{ params.space | tojson }}",
        failure={"max_failures": 2},
        py_modules=[TESTKIT],
        progress_interval_s=0.5,
        poll_interval=1.0,
        deferrable=True,
    )
