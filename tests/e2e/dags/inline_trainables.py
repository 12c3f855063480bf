"""Trainables written in the DAG file itself and passed as objects, the first thing most users write.

Airflow loads this file under a module name no Ray node can import, so the operator ships both trainables by value.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG
from ray import tune

from airflow_tune.operators.tune import RayTuneOperator

STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
BEST_X = 3


def distance(x: float) -> float:
    return float((x - BEST_X) ** 2)


def train_function(config):
    """Function API: one report per step."""
    for step in range(int(config["steps"])):
        tune.report({"loss": distance(config["x"]) + 1.0 / (step + 1)})


class TrainClass(tune.Trainable):
    """Class API: setup/step."""

    def setup(self, config):
        self.x = config["x"]

    def step(self):
        # self.iteration counts the steps done before this one.
        return {"loss": distance(self.x) + 1.0 / (self.iteration + 1)}


for _mode in ("blocking", "deferred"):
    with DAG(f"aft_inline_{_mode}", schedule=None, catchup=False, tags=["test"]) as _dag:
        for _task_id, _trainable, _extra in (
            ("tune_function", train_function, {}),
            ("tune_class", TrainClass, {"stop": {"training_iteration": 2}}),
        ):
            RayTuneOperator(
                task_id=_task_id,
                trainable=_trainable,
                storage_path=STORAGE,
                metric="loss",
                mode="min",
                param_space={"x": {"grid_search": [1, 3, 5]}, "steps": 2},
                poll_interval=0.5,
                progress_interval_s=1.0,
                deferrable=_mode == "deferred",
                **_extra,
            )
    globals()[f"inline_{_mode}"] = _dag
