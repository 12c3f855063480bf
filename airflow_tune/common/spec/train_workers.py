"""``resources.train_workers``: the Ray Train workers a trial's trainable starts (a Train run inside a trial).

Ray Train V2 (the default in Ray 2.60) places a trainer's workers in a placement group of its own, outside the
trial's: Tune reserves only the trial's own resources (the driver function, ``per_trial`` or ``bundles``) and never
sees the workers'. Declared here (``{"num_workers": 2, "per_worker": {"cpu": 1}, "strategy": "PACK"}``, the same as
the trainer's ``ScalingConfig``), they are counted by the engine's feasibility check: an experiment whose trials and
their Train workers no node set can hold fails, naming them, instead of Train waiting for its workers forever. Pure
data, checked here; imports neither airflow nor ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.errors import Errors, is_int
from airflow_tune.common.spec.resources import check_bundle, is_node_pin, ray_name

FIELD = "resources.train_workers"
#: What a Train worker asks for when ``per_worker`` is not given (ScalingConfig's default: 1 CPU).
DEFAULT_PER_WORKER = {"CPU": 1.0}
#: Ray's placement strategies (the same as ``parts.PLACEMENT_STRATEGIES``, which imports this module).
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
KEYS = ("num_workers", "per_worker", "strategy")


def check_train_workers(value: Any, errors: Errors) -> None:
    """Every problem of a ``train_workers`` value, added to ``errors``."""
    if not isinstance(value, Mapping):
        errors.add(FIELD, value, "must be a JSON object", 'write {"num_workers": 2, "per_worker": {"cpu": 1}}')
        return
    for key in value:
        if key not in KEYS:
            errors.add(f"{FIELD}.{key}", value[key], "unknown field", f"train_workers takes {', '.join(KEYS)}")
    num: Any = value.get("num_workers")
    if not is_int(num) or num < 1:
        errors.add(
            f"{FIELD}.num_workers", num, "must be an integer >= 1", "give the trainer's ScalingConfig num_workers"
        )
    per_worker = value.get("per_worker", DEFAULT_PER_WORKER)
    if not isinstance(per_worker, Mapping) or not per_worker:
        errors.add(f"{FIELD}.per_worker", per_worker, "must be a non-empty object", 'write {"cpu": 1}')
    else:
        check_bundle(per_worker, f"{FIELD}.per_worker", errors)
        for key in filter(is_node_pin, per_worker):
            # Pins are taken only where the DAG file's literal can be checked (resources.per_trial and bundles).
            errors.add(
                f"{FIELD}.per_worker.{key}",
                per_worker[key],
                "a node pin is not taken here",
                "drop it; pin the "
                "Train workers with the trainer's ScalingConfig(label_selector=...) in the trainable's code",
            )
    strategy = value.get("strategy", "PACK")
    if strategy not in STRATEGIES:
        errors.add(f"{FIELD}.strategy", strategy, "unknown strategy", f"use one of {', '.join(STRATEGIES)}")


def worker_group(value: Mapping[str, Any] | None) -> tuple[list[dict[str, float]], str] | None:
    """The Train workers' placement group as Ray names it: one bundle per worker (Ray's resource names, zero amounts
    left out) and its strategy; None when no workers are declared."""
    if not value:
        return None
    per_worker = value.get("per_worker", DEFAULT_PER_WORKER)
    bundle = {ray_name(k): float(v) for k, v in per_worker.items() if v}
    return [dict(bundle) for _ in range(int(value["num_workers"]))], str(value.get("strategy", "PACK"))
