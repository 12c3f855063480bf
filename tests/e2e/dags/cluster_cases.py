"""DAGs of the multi-node cluster tests (tests/e2e/test_cluster.py): no retries for a lost worker node, which the
experiment itself must survive inside one try of the task; one retry for a lost head, which takes the driver with it."""

from __future__ import annotations

import os
from datetime import timedelta
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

with DAG(
    "aft_cluster_head_loss",
    schedule=None,
    catchup=False,
    tags=["test"],
    default_args={"retries": 1, "retry_delay": timedelta(seconds=1)},
    params={"space": Param({"x": {"grid_search": [1, 2]}}, type="object")},
) as head_loss:
    RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.nodes:checkpointing",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space="{{ params.space | tojson }}",
        failure={"max_failures": 2},
        # Tune saves the experiment's state to S3 after every 2 checkpoints of a trial (and every 10 s).
        checkpoint={"num_to_keep": 2},
        # The retry may reach the new head before its worker nodes are back (they exit and restart after a loss).
        infeasible_wait_s=120,
        # The new head knows no job of the lost one, so no log proves the saved state: the test's storage is its own.
        restore_unproven_state=True,
        py_modules=[TESTKIT],
        progress_interval_s=0.5,
        poll_interval=1.0,
        deferrable=True,
    )
