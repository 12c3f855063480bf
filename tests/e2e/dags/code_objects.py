"""Tune's code objects written in the DAG file, run as plain Tune runs them (issue 33).

``tune_code``: one experiment of three trials (a grid over ``kind``) with ``tune.with_parameters(train,
data=BIG)`` as the trainable, ``x`` drawn by ``tune.sample_from`` with a lambda of this file, and three custom
stoppers: a Stopper object of a class defined here (stops kind "a" at iteration 2), a stop function defined here
(kind "b" at 3), and a Stopper class by import path with its arguments (kind "c" at 4). Without them each trial runs
10 iterations. The other tasks are refused before anything is submitted: a numpy array in ``param_space``, a
``with_parameters`` argument that cannot be pickled, and a stopper's import path that comes from a Param.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
from airflow.sdk import DAG, Param
from ray import tune
from ray.tune.stopper import Stopper

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
BIG = list(range(100_000))
X_OF = {"a": 7, "b": 11, "c": 13}
ITERATIONS = 10


def train(config, data=None):
    for _ in range(ITERATIONS):
        tune.report({"loss": float(config["x"]), "kind": config["kind"], "data_len": len(data), "data_sum": sum(data)})


class StopKindAt(Stopper):
    def __init__(self, kind, after):
        self.kind = kind
        self.after = after

    def __call__(self, trial_id, result):
        return result.get("kind") == self.kind and result["training_iteration"] >= self.after

    def stop_all(self):
        return False


def stop_b(trial_id, result):
    return result.get("kind") == "b" and result["training_iteration"] >= 3


def _tune(task_id, **kwargs):
    return RayTuneOperator(
        task_id=task_id,
        storage_path=STORAGE,
        metric="loss",
        mode="min",
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        poll_interval=0.5,
        **kwargs,
    )


with DAG(
    "aft_code_objects",
    schedule=None,
    catchup=False,
    tags=["test"],
    params={"stopper": Param("tune_testkit.stoppers:StopKindAt", type="string")},
) as code_objects:
    _tune(
        "tune_code",
        trainable=tune.with_parameters(train, data=BIG),
        param_space={
            "kind": tune.grid_search(["a", "b", "c"]),
            "x": tune.sample_from(lambda spec: X_OF[spec.config.kind]),
        },
        stop=[
            StopKindAt("a", 2),
            stop_b,
            {"factory": "tune_testkit.stoppers:StopKindAt", "args": {"kind": "c", "after": 4}},
        ],
    )
    _tune("numpy_space", trainable=train, param_space={"w": np.array([0.1, 0.2])})
    _tune("unpicklable_data", trainable=tune.with_parameters(train, data=BIG, lock=threading.Lock()))
    _tune("param_stopper", trainable=train, param_space={"x": 1, "kind": "a"}, stop="{{ params.stopper }}")
