"""Settings shared by the example DAGs, from the environment so the same files run on the local stack and a cluster.

AIRFLOW_TUNE_STORAGE_URI   where experiments and checkpoints go (default s3://airflow-tune/experiments)
AIRFLOW_TUNE_REGISTRY_URI  the model registry: MLflow's Model Registry, models:/<name> (default models:/digits,
                           through the mlflow_default connection; the trials are then tracked in MLflow too), or one
                           on S3, s3://bucket/models/<name>
"""

from __future__ import annotations

import os

from digits_tuning import PACKAGE_DIR

from airflow_tune.registry import registry_asset

# [START howto_example_settings]
STORAGE_URI = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
REGISTRY_URI = os.environ.get("AIRFLOW_TUNE_REGISTRY_URI", "models:/digits")
REGISTRY = registry_asset(REGISTRY_URI)
# The DAGs that share the registry, by id: the retraining DAG and the tune-from-the-UI DAG both promote into it, and
# each lists both (a registry takes a DAG only when every DAG that promotes into it lists that DAG).
REGISTRY_DAGS = ["digits_retrain_weekly", "digits_tune_from_ui"]
# With MLflow's registry, the trials are tracked on the same server (a run per trial under a parent run per DAG run),
# and the promoted version links to the best trial's run.
TRACK_IN_MLFLOW = REGISTRY_URI.startswith("models:/")
# What a promotion registers: an MLflow Model whose python_function loads the checkpoint's scikit-learn model
# (named by import path: the digits_tuning package travels in the model's code/ folder), a row of 64 pixels as its
# input example (a tensor signature: serve it {"inputs": [[...64 floats...]]}), and what it needs to run.
MODEL_LOADER = "digits_tuning.pyfunc:DigitsClassifier"
INPUT_EXAMPLE = [[0.0] * 64]
MODEL_REQUIREMENTS = ["scikit-learn==1.9.1", "numpy"]
# The trainables travel with each Ray job; a cluster without scikit-learn also needs pip=["scikit-learn"].
SHIP_TRAINABLES = {"py_modules": [PACKAGE_DIR]}
# [END howto_example_settings]


def champion_uri() -> str:
    """What a deploy loads as an MLflow Model: ``models:/<name>@champion`` in MLflow, or the S3 registry itself (its
    champion); airflow_tune.checkpoints.download_model resolves, proves and verifies either."""
    return f"{REGISTRY_URI}@champion" if REGISTRY_URI.startswith("models:/") else REGISTRY_URI
