"""A trial's output where users look: the defaults (``log_to_file`` on, ``sync_artifacts`` off, ``trial_logs``
"errored") with a ``trial_name_creator`` and a ``trial_dirname_creator`` written in this file (shipped by value, as a
trainable defined here is); one of two trials prints and raises."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")


def name_trial(trial) -> str:
    return f"dagfile_x{trial.config['x']}"


def folder_of_trial(trial) -> str:
    return f"dagfile_dir_x{trial.config['x']}_{trial.trial_id}"


with DAG("aft_trial_output", schedule=None, catchup=False, tags=["test"]) as trial_output:
    RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.output:chatty",
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [1, 2]}, "fail_at": 2},
        trial_name_creator=name_trial,
        trial_dirname_creator=folder_of_trial,
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        poll_interval=0.5,
        deferrable=True,
    )
