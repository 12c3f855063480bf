"""DAGs for the Airflow-side e2e tests. The search space comes from the run's conf (``params.space``), rendered into
the operator with ``| tojson``, so each test picks its own marker folder, trial speed and steps."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, Param

from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.sensors.tune import RayTuneSensor

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
SPACE = "{{ params.space | tojson }}"
DEFAULT_SPACE = {"x": {"grid_search": [1, 3]}, "steps": 2}


def _dag(dag_id: str) -> DAG:
    return DAG(
        dag_id,
        schedule=None,
        catchup=False,
        tags=["test"],
        params={"space": Param(DEFAULT_SPACE, type="object")},
    )


def _tune(task_id: str = "tune", trainable: str = "tune_testkit.airflow_cases:stepper", **kwargs) -> RayTuneOperator:
    kwargs.setdefault("poll_interval", 0.5)
    return RayTuneOperator(
        task_id=task_id,
        trainable=trainable,
        storage_path=kwargs.pop("storage_path", STORAGE),
        metric="loss",
        mode=kwargs.pop("mode", "min"),
        param_space=kwargs.pop("param_space", SPACE),
        checkpoint={"num_to_keep": 2},
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        **kwargs,
    )


def _submit_and_sense(dag_id: str, deferrable: bool, target: float | None = None, timeout: float = 180) -> DAG:
    with _dag(dag_id) as dag:
        submit = _tune("submit", wait_for_completion=False)
        sense = RayTuneSensor(
            task_id="sense",
            job_id="{{ ti.xcom_pull(task_ids='submit')['job_id'] }}",
            experiment_uri="{{ ti.xcom_pull(task_ids='submit')['experiment_uri'] }}",
            target=target,
            poke_interval=1,
            timeout=timeout,
            deferrable=deferrable,
        )
        submit >> sense
    return dag


submit_poke = _submit_and_sense("aft_submit_poke", deferrable=False)
submit_deferred = _submit_and_sense("aft_submit_deferred", deferrable=True)
target_poke = _submit_and_sense("aft_target_poke", deferrable=False, target=1.5)
target_deferred = _submit_and_sense("aft_target_deferred", deferrable=True, target=1.5)
sense_timeout = _submit_and_sense("aft_sense_timeout", deferrable=True, timeout=5)

for _mode in ("blocking", "deferred"):
    with _dag(f"aft_boom_{_mode}") as _boom_dag:
        _tune(trainable="tune_testkit.airflow_cases:boom", deferrable=_mode == "deferred")
    globals()[f"boom_{_mode}"] = _boom_dag

    with _dag(f"aft_timeout_{_mode}") as _timeout_dag:
        _tune(deferrable=_mode == "deferred", execution_timeout=timedelta(seconds=10))
    globals()[f"timeout_{_mode}"] = _timeout_dag

    with _dag(f"aft_pause_{_mode}") as _pause_dag:
        # No retries: a paused S3 endpoint must be ridden out within the one try. Half a CPU per trial, so that both
        # modes' experiments run side by side through the same pause.
        _tune(deferrable=_mode == "deferred", retries=0, resources_per_trial={"cpu": 0.5})
    globals()[f"pause_{_mode}"] = _pause_dag

with _dag("aft_retry") as retry:
    # One retry at once: a try that fails because its Ray job was stopped is followed by one that resumes.
    _tune(retries=1, retry_delay=timedelta(seconds=0))

with _dag("aft_bad_spec") as bad_spec:
    _tune(mode="maximize")

with _dag("aft_crashy") as crashy:
    _tune(trainable="tune_testkit.airflow_cases:crashy", failure={"max_failures": 3}, deferrable=True)

for _mode in ("blocking", "deferred"):
    with _dag(f"aft_dashboard_pause_{_mode}") as _pause_dashboard_dag:
        _tune(deferrable=_mode == "deferred", retries=0, resources_per_trial={"cpu": 0.5})
    globals()[f"dashboard_pause_{_mode}"] = _pause_dashboard_dag

with _dag("aft_large_kwargs") as large_kwargs:
    # 2 MB of keyword arguments: over Linux's 128 KB limit for one environment variable and the Jobs API's limit.
    # Rendered at run time, so the serialized DAG stays small.
    _tune(
        trainable="tune_testkit.functions:sized",
        trainable_kwargs='{"blob": "{{ "x" * 2000000 }}"}',
        deferrable=True,
        param_space={"x": {"grid_search": [1, 2]}},
    )

with _dag("aft_unimportable") as unimportable:
    _tune(trainable="no_such_pkg.train:fn")

with _dag("aft_no_bucket") as no_bucket:
    _tune(storage_path="s3://no-such-bucket-aft/experiments")
