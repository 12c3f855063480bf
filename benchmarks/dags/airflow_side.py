"""The DAGs of :mod:`benchmarks.airflow_overhead`: the 4-trial grid as one tune task, blocking and deferred."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "tests" / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")

for _mode in ("blocking", "deferred"):
    with DAG(f"bench_airflow_side_{_mode}", schedule=None, catchup=False) as _dag:
        RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.functions:quadratic",
            metric="loss",
            mode="min",
            param_space={"x": {"grid_search": [1, 2, 3, 4]}, "steps": 5},
            storage_path=STORAGE,
            py_modules=[TESTKIT],
            deferrable=_mode == "deferred",
        )
    globals()[_dag.dag_id] = _dag
