"""DAGs the compatibility tier runs under an older Airflow's real processes, with no Ray on the Airflow side.

The trainable is an import path of code that lives on the cluster: the test cluster is this machine, so the job's
``PYTHONPATH`` names the test kit's folder and nothing is shipped from Airflow.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, Param, task

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.sensors.tune import RayTuneSensor

ON_THE_CLUSTER = str(Path(__file__).resolve().parents[2] / "support")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
SPACE = {"x": {"grid_search": [1, 3]}, "steps": 2}
REGISTRY = STORAGE.rsplit("/", 1)[0] + "/registry"
HELD_BACK_REGISTRY = STORAGE.rsplit("/", 1)[0] + "/registry-held-back"


def _tune(task_id: str, deferrable: bool, param_space: object = SPACE, **kwargs: object) -> RayTuneOperator:
    return RayTuneOperator(
        task_id=task_id,
        trainable="tune_testkit.airflow_cases:stepper",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space=param_space,
        resources_per_trial={"cpu": 0.5},
        runtime_env={"env_vars": {"PYTHONPATH": ON_THE_CLUSTER}},
        progress_interval_s=1.0,
        poll_interval=0.5,
        stop_wait_s=20,
        deferrable=deferrable,
        **kwargs,  # type: ignore[arg-type]
    )


with DAG("aft_compat_modes", schedule=None, catchup=False, tags=["test"]) as modes:
    _tune("blocking", deferrable=False)
    _tune("deferred", deferrable=True)

with DAG(
    "aft_compat_kill",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"space": Param(SPACE, type="object")},
) as kill:
    _tune("deferred", deferrable=True, param_space="{{ params.space | tojson }}")

# The sensor (deferred: the trigger follows the submitted job) and the promotion (a champion written to the registry,
# and a gate that holds back, skipping its downstream task through that Airflow's SkipMixin).
with DAG("aft_compat_sensor_promote", schedule=None, catchup=False, tags=["test"]) as sensor_promote:
    submit = _tune("submit", deferrable=False, wait_for_completion=False)
    sense = RayTuneSensor(
        task_id="sense",
        job_id="{{ ti.xcom_pull(task_ids='submit')['job_id'] }}",
        experiment_uri="{{ ti.xcom_pull(task_ids='submit')['experiment_uri'] }}",
        poke_interval=1,
        timeout=180,
        deferrable=True,
    )
    promote = PromoteCheckpointOperator(task_id="promote", result=sense.output, registry_uri=REGISTRY)
    held_back = PromoteCheckpointOperator(
        task_id="held_back", result=sense.output, registry_uri=HELD_BACK_REGISTRY, gate="threshold", threshold=-1e9
    )

    @task
    def deploy(decision: dict) -> str:
        return str(decision["version"])

    @task
    def deploy_held_back(decision: dict) -> str:
        return str(decision["version"])

    submit >> sense
    deploy(promote.output)
    deploy_held_back(held_back.output)
