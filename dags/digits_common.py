"""Settings shared by the example DAGs, from the environment so the same files run on the local stack and a cluster.

AIRFLOW_TUNE_STORAGE_URI   where experiments and checkpoints go (default s3://airflow-tune/experiments)
AIRFLOW_TUNE_REGISTRY_URI  the model registry (default s3://airflow-tune/models/digits)
"""

from __future__ import annotations

import os

from digits_tuning import PACKAGE_DIR

from airflow_tune.registry import registry_asset

STORAGE_URI = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
REGISTRY_URI = os.environ.get("AIRFLOW_TUNE_REGISTRY_URI", "s3://airflow-tune/models/digits")
REGISTRY = registry_asset(REGISTRY_URI)
# The trainables travel with each Ray job; a cluster without scikit-learn also needs pip=["scikit-learn"].
SHIP_TRAINABLES = {"py_modules": [PACKAGE_DIR]}
