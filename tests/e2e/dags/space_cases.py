"""Search spaces as Tune writes them, through RayTuneOperator on the real stack.

``aft_tune_objects``: the same space twice, once with Tune's own sample objects at depth (nested configs, lists, a
choice's values) and once in the spec's JSON form; the two tasks must give one spec and one fingerprint, and every
trial a value Tune sampled from the domain. ``aft_named_arguments``: a primitive's arguments given by name, bound by
Tune's names (``qrandn`` with mean 100 and sd 20 samples around 100, not exactly 100 every time).
"""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG
from ray import tune

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
NUM_SAMPLES = 3  # times the grid's 2 values: 6 trials a task

TUNE_OBJECTS = {
    "model": {
        "lr": tune.loguniform(1e-4, 1e-1),
        "layers": [tune.randint(1, 4), tune.qrandint(8, 64, 8), tune.lograndint(1, 1000)],
        "act": tune.choice(["relu", {"kind": "leaky", "slope": tune.uniform(0, 0.3)}]),
        "width": tune.qlograndint(2, 1024, 2),
    },
    "opt": {
        "momentum": tune.quniform(0, 1, 0.1),
        "decay": tune.qloguniform(1e-3, 1, 1e-3),
        "noise": tune.randn(0, 2),
        "jitter": tune.qrandn(100, 20, 0.5),
        "name": "sgd",
    },
    "bs": tune.grid_search([16, 32]),
    "steps": 1,
}
JSON_FORM = {
    "model": {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "layers": [{"randint": [1, 4]}, {"qrandint": [8, 64, 8]}, {"lograndint": [1, 1000]}],
        "act": {"choice": ["relu", {"kind": "leaky", "slope": {"uniform": [0, 0.3]}}]},
        "width": {"qlograndint": [2, 1024, 2]},
    },
    "opt": {
        "momentum": {"quniform": [0, 1, 0.1]},
        "decay": {"qloguniform": [1e-3, 1, 1e-3]},
        "noise": {"randn": [0, 2]},
        "jitter": {"qrandn": [100, 20, 0.5]},
        "name": "sgd",
    },
    "bs": {"grid_search": [16, 32]},
    "steps": 1,
}


def _tune(task_id: str, param_space: dict, num_samples: int) -> RayTuneOperator:
    return RayTuneOperator(
        task_id=task_id,
        trainable="tune_testkit.spaces:reports_once",
        storage_path=STORAGE,
        metric="score",
        mode="max",
        param_space=param_space,
        num_samples=num_samples,
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        poll_interval=0.5,
    )


with DAG("aft_tune_objects", schedule=None, catchup=False, tags=["test"]) as tune_objects:
    _tune("tune_objects", TUNE_OBJECTS, NUM_SAMPLES)
    _tune("json_form", JSON_FORM, NUM_SAMPLES)

with DAG("aft_named_arguments", schedule=None, catchup=False, tags=["test"]) as named_arguments:
    _tune("named", {"jitter": {"qrandn": {"mean": 100, "sd": 20, "q": 0.5}}, "steps": 1}, 8)
