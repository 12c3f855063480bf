"""DAGs for the MLflow registry tests: a stand-in ``tune`` task hands the run's conf ``result`` to the real
PromoteCheckpointOperator promoting into ``models:/<name>`` (written literally, so the Asset is known at parse
time), an asset-scheduled consumer of that registry, and the same promotion with its threshold rendered from a Param
and the result as a JSON string (the registry and the gate are written here: they are not data)."""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.promote import PromoteCheckpointOperator, registry_asset

MLFLOW_REGISTRY = "models:/aft-e2e-mlflow-skip"
MLFLOW_TEMPLATED_REGISTRY = "models:/aft-e2e-templated"

with DAG("aft_promote_mlflow", schedule=None, catchup=False, tags=["test"]) as promote_mlflow:

    @task
    def tune() -> dict:
        from tests.support.sealed import stand_in_tune

        return stand_in_tune()

    promote = PromoteCheckpointOperator(
        task_id="promote", result=tune(), registry_uri=MLFLOW_REGISTRY, gate="better_than_champion"
    )

    @task
    def deploy(decision: dict) -> dict:
        from airflow_tune.checkpoints import download_checkpoint

        folder = download_checkpoint(f"{MLFLOW_REGISTRY}@champion")
        with open(f"{folder}/w.bin", "rb") as fh:
            return {"deployed": decision["version"], "weights": fh.read().decode()}

    deploy(promote.output)

with DAG("aft_promote_mlflow_consumer", schedule=[registry_asset(MLFLOW_REGISTRY)], catchup=False) as consumer:

    @task
    def serve() -> None:
        pass

    serve()

with DAG(
    "aft_promote_mlflow_templated",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"threshold": Param("0.5", type="string")},
) as promote_templated:

    @task
    def tune_json() -> str:
        import json

        from tests.support.sealed import stand_in_tune

        return json.dumps(stand_in_tune())

    PromoteCheckpointOperator(
        task_id="promote",
        result="{{ ti.xcom_pull(task_ids='tune_json') }}",
        registry_uri=MLFLOW_TEMPLATED_REGISTRY,
        gate="threshold",
        threshold="{{ params.threshold }}",
    ).set_upstream(tune_json())
