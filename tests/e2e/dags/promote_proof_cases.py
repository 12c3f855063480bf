"""DAGs for the promotion's proof of the bytes it registers (issue 40): a real experiment (RayTuneOperator on the
session's Ray head and S3 endpoint), then a ``tamper`` task standing in for a writer of the experiment's storage
after the experiment ended (the run's conf says what it does to the best checkpoint: ``overwrite`` one file with a
pickle that leaves the conf's ``marker`` file when unpickled, ``add`` such a file, or nothing), then the real
PromoteCheckpointOperator into an S3 registry, MLflow's registry, and MLflow's registry as an MLflow Model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
S3_REGISTRY = "s3://airflow-tune/e2e-registry/proof"
MLFLOW_REGISTRY = "models:/aft-e2e-proof"
MLFLOW_MODEL_REGISTRY = "models:/aft-e2e-proof-pyfunc"


def load_state(checkpoint_dir: str) -> Any:
    """The stepper's checkpoint as a model: predicts its loss for every row."""
    with open(os.path.join(checkpoint_dir, "state.json")) as fh:
        state = json.load(fh)
    return lambda rows: [state["loss"] for _ in rows]


class _LeavesMarker:
    """Pickled as ``open(marker, "w")``: unpickling it anywhere leaves the marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


with DAG("aft_promote_proof", schedule=None, catchup=False, tags=["test"]) as promote_proof:
    tune = RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.airflow_cases:stepper",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [3.0]}, "steps": 1},
        py_modules=[TESTKIT],
        poll_interval=0.5,
    )

    @task
    def tamper(result: dict) -> dict:
        import pickle

        import boto3

        conf = get_current_context()["dag_run"].conf
        what, marker = conf.get("tamper"), str(conf.get("marker"))
        bucket, _, prefix = str(result["best_checkpoint_uri"]).removeprefix("s3://").partition("/")
        s3 = boto3.client("s3")
        if what == "overwrite":
            s3.put_object(Bucket=bucket, Key=f"{prefix}/state.json", Body=pickle.dumps(_LeavesMarker(marker)))
        elif what == "add":
            s3.put_object(Bucket=bucket, Key=f"{prefix}/loader.pkl", Body=pickle.dumps(_LeavesMarker(marker)))
        return result

    tampered = tamper(tune.output)
    for task_id, registry, loader in (
        ("promote_s3", S3_REGISTRY, None),
        ("promote_mlflow", MLFLOW_REGISTRY, None),
        ("promote_model", MLFLOW_MODEL_REGISTRY, load_state),
    ):
        PromoteCheckpointOperator(
            task_id=task_id,
            result=tampered,
            registry_uri=registry,
            gate="always",
            model_loader=loader,
            skip_downstream_if_not_promoted=False,
        )
