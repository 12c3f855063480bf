"""The promotion DAG the MLflow Model tests share: a stand-in ``tune`` task (its conf ``result``, its job minted and
recorded for the run) into the real PromoteCheckpointOperator with a model loader. Outside the DAGs folder, so a DAG
file importing it registers no other file's DAGs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk import DAG, task

from airflow_tune.operators.promote import PromoteCheckpointOperator


def model_promote_dag(dag_id: str, registry: str, loader: Callable[[str], Any], input_example: Any) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"]) as dag:

        @task
        def tune() -> dict:
            from tests.support.sealed import stand_in_tune

            return stand_in_tune()

        PromoteCheckpointOperator(
            task_id="promote",
            result=tune(),
            registry_uri=registry,
            gate="always",
            model_loader=loader,
            model_input_example=input_example,
            model_requirements=["scikit-learn"],
        )
    return dag
