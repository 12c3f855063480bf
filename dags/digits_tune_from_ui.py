"""Tune from the Airflow UI's trigger form: the search space, budget and metric are Params checked by JSON schema.

Uses the Class API trainable (SGD, one pass per step, checkpoints every 2 steps and at the end).

Whoever may trigger this DAG chooses data only: the schema admits one primitive per parameter with scalar values, and
the operator refuses anything Ray Tune would run as code and any import path the DAG file did not write.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task
from digits_common import (
    INPUT_EXAMPLE,
    MODEL_LOADER,
    MODEL_REQUIREMENTS,
    REGISTRY_DAGS,
    REGISTRY_URI,
    SHIP_TRAINABLES,
    STORAGE_URI,
)

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.spec import search_space_schema

# [START howto_operator_ray_tune_trigger_form]
# Each parameter is one primitive with its exact arguments; choice and grid_search values are scalars.
SEARCH_SPACE_SCHEMA = search_space_schema(
    ("uniform", "quniform", "loguniform", "qloguniform", "randint", "qrandint", "choice", "grid_search")
)

with DAG(
    dag_id="digits_tune_from_ui",
    schedule=None,
    catchup=False,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
    params={
        "search_space": Param(
            {"alpha": {"loguniform": [1e-6, 1e-2]}, "eta0": {"loguniform": [1e-3, 1e-1]}},
            description='Search space: each parameter is one primitive, e.g. {"alpha": {"loguniform": [1e-6, 0.01]}}',
            **SEARCH_SPACE_SCHEMA,
        ),
        "num_samples": Param(4, type="integer", minimum=1, maximum=64, description="Trials to run"),
        "max_steps": Param(6, type="integer", minimum=1, maximum=100, description="Passes over the data per trial"),
        "time_budget_s": Param(300, type="integer", minimum=10, maximum=7200, description="Stop after this long"),
        "promote": Param(False, type="boolean", description="Promote the winner if it beats the champion"),
    },
) as dag:
    tune = RayTuneOperator(
        task_id="tune",
        trainable="digits_tuning.trainables:SGDDigits",
        storage_path=STORAGE_URI,
        metric="val_accuracy",
        mode="max",
        param_space="{{ params.search_space | tojson }}",
        num_samples="{{ params.num_samples }}",
        time_budget_s="{{ params.time_budget_s }}",
        stop='{"training_iteration": {{ params.max_steps }}}',
        checkpoint={"frequency": 2, "at_end": True, "num_to_keep": 2},
        poll_interval=2.0,
        progress_interval_s=2.0,
        deferrable=True,
        **SHIP_TRAINABLES,
    )
    # [END howto_operator_ray_tune_trigger_form]

    @task.short_circuit
    def promotion_requested(**context) -> bool:
        return bool(context["params"]["promote"])

    promote = PromoteCheckpointOperator(
        task_id="promote",
        result=tune.output,
        registry_uri=REGISTRY_URI,
        registry_dags=REGISTRY_DAGS,  # both example DAGs promote into the digits registry
        gate="better_than_champion",
        model_loader=MODEL_LOADER,  # an MLflow Model, as the retraining DAG promotes (the deploy DAG loads it)
        model_input_example=INPUT_EXAMPLE,
        model_requirements=MODEL_REQUIREMENTS,
    )
    tune >> promotion_requested() >> promote
