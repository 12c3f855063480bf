"""Trainables that check the resources and placement group Tune gives them."""

from __future__ import annotations

import time

import ray
from ray import tune
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .markers import mark


@ray.remote
class Helper:
    """A child actor a trial starts in the second bundle of its placement group."""

    def where(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"pg": ctx.get_placement_group_id(), "resources": ctx.get_assigned_resources()}


def with_child_actor(config: dict) -> None:
    """Starts a child actor in bundle 1 of the trial's placement group and reports where it ran."""
    pg = ray.util.get_current_placement_group()
    own_pg = ray.get_runtime_context().get_placement_group_id()
    bundle = config.get("child_bundle", 1)
    child_resources = config.get("child_resources", {"num_cpus": 1})
    helper = Helper.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle),
        **child_resources,
    ).remote()
    info = ray.get(helper.where.remote(), timeout=60)
    mark(config, "child", trainable_pg=own_pg, child=info, bundles=pg.bundle_specs if pg else None)
    ray.kill(helper)
    tune.report({"loss": abs(config["x"] - 3), "same_pg": float(info["pg"] == own_pg and own_pg is not None)})


def record_resources(config: dict) -> None:
    """Reports the resources assigned to the trial and records when it ran (to check what ran at the same time)."""
    begin = time.time()
    assigned = ray.get_runtime_context().get_assigned_resources()
    time.sleep(config.get("sleep", 0.0))
    mark(config, "ran", begin=begin, end=time.time(), resources=assigned)
    accel = sum(v for k, v in assigned.items() if k.split("_group_")[0] == "accel")
    tune.report({"loss": abs(config["x"] - 3), "accel": accel})
