"""DAGs for the MLflow Model tests: a stand-in ``tune`` task hands the run's conf ``result`` to the real
PromoteCheckpointOperator with a model loader written in this file, a function Airflow's loader (and the tests')
imports under a module name no other process can import, so it travels by value; into MLflow's Model Registry and
into an S3 registry; and one named by import path, whose package travels in the model's ``code/``."""

from __future__ import annotations

import os
import pickle

from airflow.sdk import DAG, task

from airflow_tune.operators.promote import PromoteCheckpointOperator

PYFUNC_REGISTRY = "models:/aft-e2e-pyfunc"
PYFUNC_S3_REGISTRY = "s3://airflow-tune/models/aft-e2e-pyfunc"
BY_PATH_REGISTRY = "models:/aft-e2e-pyfunc-by-path"
#: A loader named by import path: its package (which the test writes, beside a .env and notes) travels in code/.
LOADER_PATH = "aft_loader_pkg.loaders:load_classifier"
INPUT_EXAMPLE = [[0.0] * 64]


def load_classifier(checkpoint_dir):
    """The checkpoint's scikit-learn model: MLflow serves its ``predict``."""
    with open(os.path.join(checkpoint_dir, "model.pkl"), "rb") as fh:
        return pickle.load(fh)["model"]


def promote_dag(dag_id: str, registry: str, loader=load_classifier) -> DAG:
    from tests.support.promote_dags import model_promote_dag

    return model_promote_dag(dag_id, registry, loader, INPUT_EXAMPLE)


pyfunc_mlflow = promote_dag("aft_pyfunc_mlflow", PYFUNC_REGISTRY)

# One experiment promoted into two MLflow registries, the second with other requirements (so other model files).
TWO_REGISTRIES = ("models:/aft-e2e-pyfunc-a", "models:/aft-e2e-pyfunc-b")
with DAG("aft_pyfunc_two_registries", schedule=None, catchup=False, tags=["test"]) as pyfunc_two_registries:

    @task
    def tune_two() -> dict:
        from tests.support.sealed import stand_in_tune

        return stand_in_tune()

    result_two = tune_two()
    for suffix, registry, requirements in zip(
        "ab", TWO_REGISTRIES, (["scikit-learn"], ["scikit-learn", "numpy"]), strict=True
    ):
        PromoteCheckpointOperator(
            task_id=f"promote_{suffix}",
            result=result_two,
            registry_uri=registry,
            gate="always",
            model_loader=load_classifier,
            model_input_example=INPUT_EXAMPLE,
            model_requirements=requirements,
        )
pyfunc_s3 = promote_dag("aft_pyfunc_s3", PYFUNC_S3_REGISTRY)
pyfunc_by_path = promote_dag("aft_pyfunc_by_path", BY_PATH_REGISTRY, LOADER_PATH)
