"""DAGs for the promotion e2e tests: a stand-in ``tune`` task hands the run's conf ``result`` (shaped like
RayTuneOperator's XCom, pointing at objects the test put in S3) to the real PromoteCheckpointOperator; an
asset-scheduled consumer; and RayTuneOperator warm starts from a registry URI (``params.registry``) or an XCom dict."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.promote import PromoteCheckpointOperator, registry_asset
from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
SKIP_REGISTRY = "s3://airflow-tune/e2e-registry/promote-skip"
NOSKIP_REGISTRY = "s3://airflow-tune/e2e-registry/promote-noskip"
WARM_SPACE = {"x": {"uniform": [0.0, 10.0]}, "steps": 1}


def _promote_dag(dag_id: str, registry: str, skip: bool) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"]) as dag:

        @task
        def tune() -> dict:
            from tests.support.sealed import stand_in_tune

            return stand_in_tune()

        promote = PromoteCheckpointOperator(
            task_id="promote",
            result=tune(),
            registry_uri=registry,
            gate="better_than_champion",
            skip_downstream_if_not_promoted=skip,
        )

        @task
        def deploy(decision: dict) -> dict:
            return {"deployed": decision["version"], "promoted": decision["promoted"]}

        deploy(promote.output)
    return dag


promote_skip = _promote_dag("aft_promote_skip", SKIP_REGISTRY, skip=True)
promote_noskip = _promote_dag("aft_promote_noskip", NOSKIP_REGISTRY, skip=False)

with DAG("aft_promote_consumer", schedule=[registry_asset(SKIP_REGISTRY)], catchup=False, tags=["test"]) as consumer:

    @task
    def serve() -> None:
        pass

    serve()


def _warm_tune(task_id: str, warm_start: object, **kwargs: Any) -> RayTuneOperator:
    return RayTuneOperator(
        task_id=task_id,
        trainable="tune_testkit.warm:one_shot",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space=WARM_SPACE,
        num_samples=2,
        max_concurrent_trials=2,
        warm_start=warm_start,  # type: ignore[arg-type]
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        poll_interval=0.5,
        **kwargs,
    )


with DAG(
    "aft_warm_start_registry",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"registry": Param("s3://airflow-tune/e2e-registry/none", type="string")},
) as warm_registry:
    # The registry's root is written here; the conf names a registry under it (its last segment is kept).
    _warm_tune("tune", "s3://airflow-tune/e2e-registry/{{ params.registry.rsplit('/', 1)[1] }}")

with DAG(
    "aft_warm_start_deferred",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"registry": Param("s3://airflow-tune/e2e-registry/none", type="string")},
) as warm_deferred:
    _warm_tune("tune", "s3://airflow-tune/e2e-registry/{{ params.registry.rsplit('/', 1)[1] }}", deferrable=True)

with DAG(
    "aft_warm_start_from_conf",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"registry": Param("s3://airflow-tune/e2e-registry/none", type="string")},
) as warm_from_conf:
    # No registry written in the DAG file: whose champion is read is not the conf's to choose.
    _warm_tune("tune", "{{ params.registry }}")

with DAG("aft_warm_start_mlflow", schedule=None, catchup=False, tags=["test"]) as warm_mlflow:
    _warm_tune("tune", "models:/aft-warm-start@champion")

with DAG("aft_warm_start_xcom", schedule=None, catchup=False, tags=["test"]) as warm_xcom:

    @task
    def champion_config() -> dict:
        return {"x": 7.25, "steps": 99, "not_in_space": "dropped"}

    _warm_tune("tune", champion_config())
