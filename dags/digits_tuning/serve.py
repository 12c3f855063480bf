"""Deploy-side helpers: load a promoted model and score it on the held-out test set."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

from digits_tuning.trainables import MODEL_FILE


def load_model(checkpoint_uri: str, expected_digest: str | None = None) -> Any:
    """The model in a checkpoint: ``s3://...`` (verified against ``expected_digest``), or an MLflow model version
    (``models:/digits@champion``, ``models:/digits/3``) that download_checkpoint resolves, proves and verifies."""
    from airflow_tune.checkpoints import download_checkpoint

    with tempfile.TemporaryDirectory(prefix="checkpoint-") as folder:
        download_checkpoint(checkpoint_uri, folder, expected_digest=expected_digest)
        with open(os.path.join(folder, MODEL_FILE), "rb") as fh:
            return pickle.load(fh)["model"]


def holdout_accuracy(model: Any) -> float:
    """The held-out accuracy of anything with ``predict`` over rows of pixels: an MLflow ``PyFuncModel`` (from
    ``mlflow.pyfunc.load_model``) or the scikit-learn model itself."""
    import numpy as np

    from digits_tuning.data import splits

    x_test, y_test = splits()["test"]
    return float(np.mean(np.asarray(model.predict(x_test)) == y_test))


def holdout_score(model: Any) -> float:
    from digits_tuning.data import splits

    x_test, y_test = splits()["test"]
    return float(model.score(x_test, y_test))
