"""A DAG for the OpenLineage e2e test: a deferred tune task warm-started from a registry (``params.registry``), then
a promotion of its winner into that registry (its root written here), and one its threshold gate holds back."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")

with DAG(
    "aft_lineage",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"registry": Param("s3://airflow-tune/e2e-registry/lineage", type="string")},
) as lineage:
    tune = RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.functions:checkpointing",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [1, 3]}, "steps": 2},
        checkpoint={"num_to_keep": 2},
        warm_start="s3://airflow-tune/e2e-registry/{{ params.registry.rsplit('/', 1)[1] }}",
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        poll_interval=0.5,
        deferrable=True,
    )
    # A registry is written in the DAG file: its root here, the conf's registry (a name under it) after it.
    PromoteCheckpointOperator(
        task_id="promote",
        result=tune.output,
        registry_uri="s3://airflow-tune/e2e-registry/{{ params.registry.rsplit('/', 1)[1] }}",
        gate="always",
    )
    # A winner held back by its gate (the best loss is 0.01): a decision that writes nothing. A registry of its own,
    # so the other promotion's champion (this very checkpoint) is never what it finds.
    PromoteCheckpointOperator(
        task_id="promote_held",
        result=tune.output,
        registry_uri="s3://airflow-tune/e2e-registry/{{ params.registry.rsplit('/', 1)[1] }}-held",
        gate="threshold",
        threshold=0.001,
    )
