"""A DAG for an Airflow side without Ray (the provider without its ``ray`` extra), run by
tests/compat/test_airflow_side_without_ray.py in the oldest supported Airflow's environment.

- ``import_path``: the trainable is an import path of code that lives on the cluster: a package the deployment put
  there (``AFT_TESTKIT_URI``, a ``gcs://`` URI in ``py_modules``). Nothing is shipped from Airflow but the engine,
  which the provider uploads itself.
- ``by_value``: a function written here, which only Ray's cloudpickle can ship: refused before submission.
- ``local_py_modules``: a local folder in ``py_modules``, which only Ray's client packs: refused likewise.

This file imports no Ray: it parses where Ray is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
TESTKIT_URI = os.environ.get("AFT_TESTKIT_URI", "gcs://_ray_pkg_0000000000000000.zip")
LOCAL_FOLDER = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")


def by_value(config):
    """A trainable defined in the DAG file: Airflow imports this file under a name no Ray node can import."""
    from ray import tune

    tune.report({"loss": float(config["x"])})


def _tune(task_id: str, trainable: object, **kwargs: object) -> RayTuneOperator:
    return RayTuneOperator(
        task_id=task_id,
        trainable=trainable,
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [1, 3]}, "steps": 2},
        resources_per_trial={"cpu": 0.5},
        poll_interval=0.5,
        progress_interval_s=1.0,
        deferrable=False,
        retries=0,
        **kwargs,
    )


with DAG("aft_no_ray", schedule=None, catchup=False, tags=["test"]) as no_ray:
    _tune("import_path", "tune_testkit.airflow_cases:stepper", py_modules=[TESTKIT_URI])
    _tune("by_value", by_value)
    _tune("local_py_modules", "tune_testkit.airflow_cases:stepper", py_modules=[LOCAL_FOLDER])
