"""DAGs for the jobs a task believes (issue 40): a real experiment (RayTuneOperator on the session's Ray head and S3
endpoint), then a ``mint`` task standing in for anyone who may submit a Ray job (a DAG author through ``ray_default``,
or a trial: Ray hands its token to the workers) and write the experiment's storage: it submits a job whose metadata is
the tune job's own, printing the seal of a forged ``result.json`` that names it, then writes that file; then the real
PromoteCheckpointOperator into an S3 registry. And a trial that mints such a job under the id its task's retry would
submit, then fails."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
REGISTRY = "s3://airflow-tune/e2e-registry/minted"


def tune_task(trainable: str = "stepper", **kwargs: object) -> RayTuneOperator:
    return RayTuneOperator(
        task_id="tune",
        trainable=f"tune_testkit.airflow_cases:{trainable}",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [3.0]}, "steps": 1},
        py_modules=[TESTKIT],
        poll_interval=0.5,
        **kwargs,  # type: ignore[arg-type]
    )


with DAG("aft_minted_tune", schedule=None, catchup=False, tags=["test"]) as minted_tune:
    tune_task()

with DAG("aft_minted_in_trial", schedule=None, catchup=False, tags=["test"]) as minted_in_trial:
    # The first try's trial mints the job; the retry finds it.
    tune_task("mint_then_fail", retries=1, retry_delay=timedelta(seconds=0))

with DAG("aft_minted_promote", schedule=None, catchup=False, tags=["test"]) as minted_promote:

    @task
    def mint(result: dict) -> dict:
        from tests.support.minting import mint_forged_result

        mint_forged_result(result)
        return result

    PromoteCheckpointOperator(task_id="promote", result=mint(tune_task().output), registry_uri=REGISTRY, gate="always")
