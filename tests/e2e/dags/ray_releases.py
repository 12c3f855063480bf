"""Trainables of every form in one DAG, for the compatibility tier (tests/compat/test_ray_releases.py): an import path
shipped with ``working_dir``, and a function and a class written here, shipped by value. Each trial reports the Ray
version it ran with (``ray_version``) and a checkpoint. The class's trials are tracked in MLflow when
``AFT_RELEASE_MLFLOW`` is set (the test runs a server then).

The import path's module lives in ``AFT_RELEASE_WORKING_DIR`` (the test writes it there); without it the task is
left out.
"""

from __future__ import annotations

import os
import tempfile

from airflow.sdk import DAG
from ray import tune

from airflow_tune.operators.tune import RayTuneOperator

STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
WORKING_DIR = os.environ.get("AFT_RELEASE_WORKING_DIR")
BEST_X = 3


def loss_of(x: float, step: int) -> float:
    return float((x - BEST_X) ** 2) + 1.0 / (step + 1)


def train_function(config):
    """Function API, by value: reports each step with a checkpoint of it."""
    import ray

    for step in range(2):
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "step.txt"), "w") as fh:
            fh.write(str(step))
        metrics = {"loss": loss_of(config["x"], step), "ray_version": ray.__version__}
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


class TrainClass(tune.Trainable):
    """Class API, by value: setup/step/save_checkpoint/load_checkpoint."""

    def setup(self, config):
        import ray

        self.x = config["x"]
        self.version = ray.__version__

    def step(self):
        # self.iteration counts the steps done before this one.
        return {"loss": loss_of(self.x, self.iteration), "ray_version": self.version}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "x.txt"), "w") as fh:
            fh.write(str(self.x))

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "x.txt")) as fh:
            self.x = float(fh.read())


with DAG("aft_ray_releases", schedule=None, catchup=False, tags=["test"]) as ray_releases:
    common = {
        "storage_path": STORAGE,
        "metric": "loss",
        "mode": "min",
        "param_space": {"x": {"grid_search": [1, 3]}},
        "poll_interval": 0.5,
        "progress_interval_s": 1.0,
    }
    if WORKING_DIR:
        RayTuneOperator(task_id="tune_import_path", trainable="release_probe:train", working_dir=WORKING_DIR, **common)
    RayTuneOperator(task_id="tune_function", trainable=train_function, **common)
    RayTuneOperator(
        task_id="tune_class",
        trainable=TrainClass,
        stop={"training_iteration": 2},
        checkpoint={"frequency": 1},
        # The engine's MLflow callback on the release, when the test runs a tracking server beside it.
        mlflow_tracking=bool(os.environ.get("AFT_RELEASE_MLFLOW")),
        **common,
    )
