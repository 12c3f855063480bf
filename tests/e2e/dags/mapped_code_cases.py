"""DAGs that map code arguments over an upstream task's XCom (which a trigger conf fills): ``pip``, ``runtime_env``
and, through ``expand_kwargs()``, ``working_dir`` and ``py_modules``; and one that maps ``pip`` over a literal list,
which the DAG file wrote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
ONE_TRIAL: dict[str, Any] = {
    "trainable": "tune_testkit.airflow_cases:stepper",
    "storage_path": STORAGE,
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [1]}, "steps": 1},
    "poll_interval": 0.5,
}


@task
def from_conf(params: Any = None) -> Any:
    """Whatever the trigger conf's ``value`` holds, as the upstream XCom the mapped task expands over."""
    return params["value"]


def _mapped(dag_id: str, expand: Any) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"], params={"value": Param([], type="array")}) as dag:
        expand(from_conf())
    return dag


pip_from_xcom = _mapped(
    "aft_mapped_pip",
    lambda xcom: RayTuneOperator.partial(task_id="tune", py_modules=[TESTKIT], **ONE_TRIAL).expand(pip=xcom),
)
runtime_env_from_xcom = _mapped(
    "aft_mapped_runtime_env",
    lambda xcom: RayTuneOperator.partial(task_id="tune", py_modules=[TESTKIT], **ONE_TRIAL).expand(runtime_env=xcom),
)
kwargs_from_xcom = _mapped(
    "aft_mapped_kwargs", lambda xcom: RayTuneOperator.partial(task_id="tune", **ONE_TRIAL).expand_kwargs(xcom)
)

with DAG("aft_mapped_pip_literal", schedule=None, catchup=False, tags=["test"]) as pip_from_literal:
    # Written in the DAG file: requirements the cluster already satisfies. The tasks return once their jobs are
    # submitted (a pip environment takes Ray about 80 s to make here; waiting for it, both runs succeed).
    RayTuneOperator.partial(task_id="tune", py_modules=[TESTKIT], wait_for_completion=False, **ONE_TRIAL).expand(
        pip=[["numpy"], ["numpy", "pyarrow"]]
    )
