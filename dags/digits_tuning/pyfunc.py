"""The promoted digits classifier as an MLflow python_function model: what ``mlflow.pyfunc.load_model`` and ``mlflow
models serve`` run. The retraining DAG names it as ``model_loader="digits_tuning.pyfunc:DigitsClassifier"``, so this
package travels in each model's ``code/`` folder: it must not import Ray (a serving image has none).
"""

from __future__ import annotations

import os
import pickle

import mlflow.pyfunc

MODEL_FILE = "model.pkl"  # as digits_tuning.trainables writes it


class DigitsClassifier(mlflow.pyfunc.PythonModel):
    """Reads the scikit-learn model from the checkpoint (the artifact ``checkpoint``) once; predicts the digit of
    each row of 64 pixel intensities in [0, 1]."""

    def load_context(self, context):
        with open(os.path.join(context.artifacts["checkpoint"], MODEL_FILE), "rb") as fh:
            self.model = pickle.load(fh)["model"]

    def predict(self, context, model_input, params=None):
        import numpy as np

        return self.model.predict(np.asarray(model_input, dtype=float))
