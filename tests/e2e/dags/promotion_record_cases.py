"""DAGs for the promotion-record tests (issue 40): the MLflow Model tests' promotion DAG (a stand-in ``tune`` task, the
real PromoteCheckpointOperator) with a loader written in this file (travelling by value), into an S3 registry and into
MLflow's; and a deploy DAG per registry whose task loads the champion with
``download_model`` and no record given, so it finds Airflow's record of the promotion itself (the promote task's
XCom)."""

from __future__ import annotations

import json
import os

from airflow.sdk import DAG, Asset, get_current_context, task

from tests.support.promote_dags import model_promote_dag

S3_REGISTRY = "s3://airflow-tune/models/aft-e2e-record"
MLFLOW_REGISTRY = "models:/aft-e2e-record"
INPUT_EXAMPLE = [[0.0] * 64]


def load_weights(checkpoint_dir):
    """The checkpoint's weights (JSON, never a pickle): the model multiplies each row's sum by them."""
    with open(os.path.join(checkpoint_dir, "weights.json")) as fh:
        scale = json.load(fh)["scale"]
    return lambda rows: [scale * sum(row) for row in rows.tolist()]


def deploy_dag(dag_id: str, uri: str) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"]) as dag:

        @task
        def deploy() -> list:
            from airflow_tune.checkpoints import download_model

            folder = download_model(uri)
            return sorted(os.listdir(folder))

        deploy()
    return dag


record_s3 = model_promote_dag("aft_record_s3", S3_REGISTRY, load_weights, INPUT_EXAMPLE)
record_mlflow = model_promote_dag("aft_record_mlflow", MLFLOW_REGISTRY, load_weights, INPUT_EXAMPLE)
deploy_s3 = deploy_dag("aft_record_deploy_s3", S3_REGISTRY)
deploy_mlflow = deploy_dag("aft_record_deploy_mlflow", f"{MLFLOW_REGISTRY}@champion")


with DAG("aft_record_deploy_s3_event", schedule=None, catchup=False, tags=["test"]) as deploy_s3_event:
    REGISTRY_ASSET = Asset(uri=S3_REGISTRY, name=S3_REGISTRY)

    @task(inlets=[REGISTRY_ASSET])
    def deploy_event() -> list:
        """The registry's newest Asset event, as Airflow hands it to a task, is the record ``download_model`` checks
        (what a deploy DAG scheduled on the registry gets in ``triggering_asset_events``)."""
        from airflow_tune.checkpoints import download_model

        event = get_current_context()["inlet_events"][REGISTRY_ASSET][-1]
        return sorted(os.listdir(download_model(S3_REGISTRY, promotion=event)))

    deploy_event()
