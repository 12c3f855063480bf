"""Class API trainables (``tune.Trainable`` subclasses), each recording its events as markers."""

from __future__ import annotations

import json
import os
import time

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory

from .markers import mark


class Stepper(tune.Trainable):
    """One step per iteration; the loss is lowest at iteration ``best_iter``, so the best checkpoint is not the last.

    Checkpoints hold the iteration, the trial's x and the loss at that iteration.
    """

    def setup(self, config: dict) -> None:
        self.x = config["x"]
        self.it = 0
        self.loss = None
        mark(config, "setup", trial_id=self.trial_id)

    def _loss(self) -> float:
        best_iter = self.config.get("best_iter", 4)
        return (self.x - 3) ** 2 + 0.1 * abs(self.it - best_iter) + 0.01 * self.it

    def step(self) -> dict:
        self.it += 1
        time.sleep(self.config.get("sleep", 0.0))
        self.loss = self._loss()
        mark(self.config, "step", it=self.it, trial_id=self.trial_id)
        return {"loss": self.loss}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as fh:
            json.dump({"it": self.it, "x": self.x, "loss": self.loss, "trial_id": self.trial_id}, fh)
        mark(self.config, "save", it=self.it, trial_id=self.trial_id)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as fh:
            state = json.load(fh)
        self.it = state["it"]
        mark(self.config, "load", it=self.it, trial_id=self.trial_id, source_trial=state["trial_id"])

    def cleanup(self) -> None:
        mark(self.config, "cleanup", it=self.it, trial_id=self.trial_id)


class Reusable(Stepper):
    """Takes a new config in place (``reset_config``), so Tune can reuse its actor for the next trial."""

    def reset_config(self, new_config: dict) -> bool:
        self.x = new_config["x"]
        self.it = 0
        self.loss = None
        mark(new_config, "reset", trial_id=self.trial_id)
        return True


class SaysDone(tune.Trainable):
    """Ends itself: ``step()`` returns ``done=True`` after ``config["iters"]`` iterations (no ``stop`` needed)."""

    def setup(self, config: dict) -> None:
        self.it = 0

    def step(self) -> dict:
        self.it += 1
        loss = abs(self.config["x"] - 3) + 1.0 / self.it
        return {"loss": loss, "done": self.it >= self.config["iters"]}


class PbtModel(tune.Trainable):
    """A "model": weight ``w`` grows by ``lr`` per step (loss ``100 - w``); PBT copies ``w`` through checkpoints."""

    def setup(self, config: dict) -> None:
        self.w = 0.0
        self.lr = config["lr"]

    def step(self) -> dict:
        self.w += self.lr
        time.sleep(self.config.get("sleep", 0.0))
        return {"loss": 100 - self.w, "w": self.w}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as fh:
            json.dump({"w": self.w, "lr": self.lr, "it": self.iteration, "trial_id": self.trial_id}, fh)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as fh:
            state = json.load(fh)
        self.w = state["w"]
        mark(self.config, "load", trial_id=self.trial_id, source_trial=state["trial_id"])

    def reset_config(self, new_config: dict) -> bool:
        self.lr = new_config["lr"]
        self.config = new_config
        return True


class WantsAccel(tune.Trainable):
    """Asks for its own resources: one CPU and one unit of the custom resource ``accel``."""

    @classmethod
    def default_resource_request(cls, config: dict) -> PlacementGroupFactory:
        return PlacementGroupFactory([{"CPU": 1, "accel": 1}])

    def setup(self, config: dict) -> None:
        import ray

        self.assigned = ray.get_runtime_context().get_assigned_resources()
        mark(config, "assigned", resources=self.assigned)

    def step(self) -> dict:
        accel = sum(v for k, v in self.assigned.items() if k.split("_group_")[0] == "accel")
        return {"loss": abs(self.config["x"] - 3), "accel": accel, "done": True}
