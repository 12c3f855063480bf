"""Searcher and scheduler factories for a spec's ``search.factory`` / ``scheduler.factory``, written as a Tune user
writes them: the searchers the spec names none of (Nevergrad, ZOOpt, BOHB with HyperBandForBOHB, Ax, HEBO), some
carrying their own metric and mode as Tune's examples do, and a ResourceChangingScheduler; plus a trainable that
records the resources each run of a trial had."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from ray import tune

from .markers import mark


def nevergrad(**kwargs: Any) -> Any:
    """NevergradSearch with (1+1) and no metric of its own: the Tuner gives it the spec's."""
    import nevergrad as ng
    from ray.tune.search.nevergrad import NevergradSearch

    return NevergradSearch(optimizer=ng.optimizers.OnePlusOne, **kwargs)


def zoopt(**kwargs: Any) -> Any:
    """ZOOptSearch (asynchronous RACOS) with its own metric and mode, as Tune's ZOOpt example writes it."""
    from ray.tune.search.zoopt import ZOOptSearch

    return ZOOptSearch(algo="asracos", metric="loss", mode="min", **kwargs)


def bohb(**kwargs: Any) -> Any:
    """TuneBOHB with its own metric and mode, as Tune's BOHB example writes it."""
    from ray.tune.search.bohb import TuneBOHB

    return TuneBOHB(metric="loss", mode="min", **kwargs)


def hyperband_for_bohb(**kwargs: Any) -> Any:
    """HyperBandForBOHB with its own metric and mode (a Tuner given the spec's too would raise at fit())."""
    from ray.tune.schedulers import HyperBandForBOHB

    return HyperBandForBOHB(time_attr="training_iteration", metric="loss", mode="min", **kwargs)


def resource_changing(max_t: int = 4) -> Any:
    """ResourceChangingScheduler over an ASHA carrying its own metric and mode, with Tune's default allocation
    (``DistributeResources``: a trial gets the cluster's free CPUs)."""
    from ray.tune.schedulers import ASHAScheduler, ResourceChangingScheduler
    from ray.tune.schedulers.resource_changing_scheduler import DistributeResources

    return ResourceChangingScheduler(
        base_scheduler=ASHAScheduler(metric="loss", mode="min", max_t=max_t, grace_period=max_t),
        resources_allocation_function=DistributeResources(add_bundles=False),
    )


def resumable(config: dict) -> None:
    """Checkpoints every step and resumes from its checkpoint; marks each run with the CPUs Tune gave it."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as fh:
            start = json.load(fh)["step"] + 1
    cpus = tune.get_context().get_trial_resources().required_resources.get("CPU")
    mark(config, "run", start=start, cpus=cpus)
    for step in range(start, config.get("steps", 4)):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as fh:
                json.dump({"step": step}, fh)
            loss = (config["x"] - 3) ** 2 + config["net"]["width"] / (step + 1)
            tune.report({"loss": loss, "cpus": cpus}, checkpoint=tune.Checkpoint.from_directory(folder))


def ax(**kwargs: Any) -> Any:
    """AxSearch with no metric of its own (the Tuner gives it the spec's), as Tune's Ax example writes it."""
    from ray.tune.search.ax import AxSearch

    return AxSearch(**kwargs)


def hebo(**kwargs: Any) -> Any:
    """HEBOSearch with its own metric and mode and a seed, as Tune's HEBO example writes it."""
    from ray.tune.search.hebo import HEBOSearch

    return HEBOSearch(metric="loss", mode="min", random_state_seed=7, **kwargs)
