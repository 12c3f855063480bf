"""The python_function model of a loader function: ``load(checkpoint_dir) -> model``, its ``predict`` served.

Pickled by value into each model folder (:mod:`airflow_tune.registries.mlflow_model`), so a model loads where MLflow is
installed and airflow-tune is not (a serving image, KServe's MLflow runtime). Imported only when a promotion builds
a model: it imports mlflow.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc


class CheckpointModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined,misc]
    """Calls ``loader(checkpoint_dir)`` once when MLflow loads the model, then its result's ``predict`` (or the
    result itself, when it is a function) for every prediction.

    :param loader: the DAG file's loader function.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.model: Any = None

    def load_context(self, context):  # type: ignore[no-untyped-def]
        self.model = self.loader(context.artifacts["checkpoint"])

    # No type hints: MLflow reads predict's hints as the model's schema, and the signature is the DAG file's.
    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        predict = getattr(self.model, "predict", None)
        return predict(model_input) if predict is not None else self.model(model_input)
