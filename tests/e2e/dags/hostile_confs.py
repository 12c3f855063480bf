"""DAGs that take the search space, scheduler, searcher and trainable kwargs from the trigger conf with no schema at
all, so whatever a conf holds reaches the operator: its own checks are the guarantee, not a Param schema."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
ONE_TRIAL = {
    "storage_path": STORAGE,
    "metric": "loss",
    "mode": "min",
    "param_space": {"x": {"grid_search": [1]}, "steps": 1},
    "py_modules": [TESTKIT],
    "poll_interval": 0.5,
}

with DAG(
    "aft_conf_as_data",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={
        "space": Param({"x": {"grid_search": [1, 3]}, "steps": 1}, type="object"),
        "scheduler": Param("fifo", type=["string", "object"]),
        "search": Param("random", type=["string", "object"]),
        "kwargs": Param({}, type="object"),
    },
) as conf_as_data:
    RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.airflow_cases:stepper",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space="{{ params.space | tojson }}",
        scheduler="{{ params.scheduler | tojson }}",
        search="{{ params.search | tojson }}",
        trainable_kwargs="{{ params.kwargs | tojson }}",
        py_modules=[TESTKIT],
        poll_interval=0.5,
    )

with DAG(
    "aft_trainable_from_conf",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"trainable": Param("tune_testkit.airflow_cases:stepper", type="string")},
    render_template_as_native_obj=True,
) as trainable_from_conf:
    RayTuneOperator(task_id="tune", trainable="{{ params.trainable }}", **ONE_TRIAL)

#: Model classes the trainable chooses among, written in the DAG file as a choice's values: data, not code.
MODELS = ["tune_testkit.classes:Stepper", "tune_testkit.classes:Reusable"]

with DAG(
    "aft_choice_is_data",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"extra": Param(1, type=["integer", "object"])},
    render_template_as_native_obj=True,
) as choice_is_data:
    RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.airflow_cases:stepper",
        **{
            **ONE_TRIAL,
            "param_space": {**ONE_TRIAL["param_space"], "model": {"choice": MODELS}, "extra": "{{ params.extra }}"},
        },
    )


def _mapped_tune(dag_id: str, trainables) -> DAG:
    params = {"trainable": Param("x", type="string")}
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"], params=params) as dag:
        if trainables is None:

            @task
            def choose(params=None) -> list[str]:
                return [params["trainable"]]

            trainables = choose()
        RayTuneOperator.partial(task_id="tune", **ONE_TRIAL).expand(trainable=trainables)
    return dag


# A mapped task is built at run time from its expanded values; one taken from an XCom is still data.
trainable_from_xcom = _mapped_tune("aft_trainable_from_xcom", None)
trainable_from_literal_expand = _mapped_tune(
    "aft_trainable_from_literal_expand", ["tune_testkit.airflow_cases:stepper"]
)
