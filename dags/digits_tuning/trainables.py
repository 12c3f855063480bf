"""Two trainables on the digits data: a Function API MLP with per-epoch checkpoints, and a Class API SGD model."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

from ray import tune

MODEL_FILE = "model.pkl"


def _save(model: Any, folder: str, **extra: Any) -> None:
    with open(os.path.join(folder, MODEL_FILE), "wb") as fh:
        pickle.dump({"model": model, **extra}, fh)


def train_mlp(config: dict[str, Any]) -> None:
    """One epoch per report, a checkpoint each epoch; resumes from its last checkpoint (ASHA, PBT, restores)."""
    import numpy as np
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier

    from digits_tuning.data import splits

    data = splits()
    x_train, y_train = data["train"]
    x_val, y_val = data["val"]
    model = MLPClassifier(
        hidden_layer_sizes=(int(config["hidden"]),),
        alpha=float(config["alpha"]),
        learning_rate_init=float(config["lr"]),
        batch_size=int(config.get("batch_size", 64)),
        random_state=int(config.get("seed", 0)),
    )
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, MODEL_FILE), "rb") as fh:
                state = pickle.load(fh)
        model, start = state["model"], state["epoch"] + 1
    for epoch in range(start, int(config.get("epochs", 10))):
        # One pass over the shuffled data per epoch; the model takes minibatches of batch_size itself.
        order = np.random.default_rng(epoch).permutation(len(x_train))
        model.partial_fit(x_train[order], y_train[order], classes=data["classes"])
        val_accuracy = float(model.score(x_val, y_val))
        val_loss = float(log_loss(y_val, model.predict_proba(x_val), labels=data["classes"]))
        with tempfile.TemporaryDirectory() as folder:
            _save(model, folder, epoch=epoch, config=dict(config))
            tune.report(
                {"val_accuracy": val_accuracy, "val_loss": val_loss, "epoch": epoch},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


class SGDDigits(tune.Trainable):
    """Class API: one pass over the training data per step; checkpoints by frequency and at the end."""

    def setup(self, config: dict[str, Any]) -> None:
        from sklearn.linear_model import SGDClassifier

        from digits_tuning.data import splits

        self.data = splits()
        self.model = SGDClassifier(
            loss=config.get("loss", "log_loss"),
            alpha=float(config["alpha"]),
            eta0=float(config.get("eta0", 0.01)),
            learning_rate=config.get("learning_rate", "optimal"),
            random_state=0,
        )

    def step(self) -> dict[str, Any]:
        x_train, y_train = self.data["train"]
        x_val, y_val = self.data["val"]
        self.model.partial_fit(x_train, y_train, classes=self.data["classes"])
        return {"val_accuracy": float(self.model.score(x_val, y_val))}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        _save(self.model, checkpoint_dir, iteration=self.iteration, config=dict(self.config))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, MODEL_FILE), "rb") as fh:
            self.model = pickle.load(fh)["model"]

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> tune.PlacementGroupFactory:
        return tune.PlacementGroupFactory([{"CPU": 1}])
