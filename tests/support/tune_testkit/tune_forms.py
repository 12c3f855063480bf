"""A Class trainable for the forms Tune runs that the spec refused before (issue 33): a nested config that PB2
mutates (``opt.lr``), run in a placement group whose head bundle is empty."""

from __future__ import annotations

import json
import os

import ray
from ray import tune

from .markers import mark


@ray.remote
class _Child:
    def resources(self) -> dict:
        return ray.get_runtime_context().get_assigned_resources()


class NestedLrModel(tune.Trainable):
    """Weight ``w`` grows by ``config["opt"]["lr"]`` per step (loss ``100 - w``); PB2 copies ``w`` by checkpoint.

    At setup it records what the trainable itself holds, the bundles of its placement group, and what a child actor
    started in the group's first bundle holds (the bundle an empty head leaves to the trial's actors).
    """

    def setup(self, config: dict) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.w = 0.0
        self.lr = config["opt"]["lr"]
        pg = ray.util.get_current_placement_group()
        child = _Child.options(
            num_cpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=0),
        ).remote()
        mark(
            config,
            "setup",
            trial_id=self.trial_id,
            own=ray.get_runtime_context().get_assigned_resources(),
            bundles=pg.bundle_specs if pg else None,
            child=ray.get(child.resources.remote(), timeout=60),
        )
        ray.kill(child)

    def step(self) -> dict:
        self.w += self.lr
        return {"loss": 100 - self.w, "w": self.w}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as fh:
            json.dump({"w": self.w, "trial_id": self.trial_id}, fh)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "state.json")) as fh:
            state = json.load(fh)
        self.w = state["w"]
        mark(self.config, "load", trial_id=self.trial_id, source_trial=state["trial_id"], lr=self.config["opt"]["lr"])

    def reset_config(self, new_config: dict) -> bool:
        self.lr = new_config["opt"]["lr"]
        self.config = new_config
        return True
