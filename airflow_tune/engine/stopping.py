"""The spec's ``stop`` as what ``tune.RunConfig(stop=...)`` takes (see :mod:`airflow_tune.common.spec.stopping`).

Tune's dict form goes through as it is. The list form becomes Tune's stoppers, combined with ``CombinedStopper``
(any stopping stops), its thresholds one :class:`Thresholds` stopper, and each custom stopper what its import path
names: a ``Stopper`` subclass called with its ``args``, a Stopper object as it is, a function ``(trial_id, result) ->
bool`` as Tune's ``FunctionStopper`` (what ``RunConfig(stop=fn)`` makes of it). Tune pickles the stop criteria in the
experiment's ``tuner.pkl`` and a restore runs with them; :class:`Thresholds` is pickled by reference to this module,
which every engine job ships, and holds nothing but its criteria.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from ray.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
)
from ray.tune.utils import flatten_dict

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.stopping import STOPPER_CLASSES, is_threshold, stopper_name
from airflow_tune.engine import compat
from airflow_tune.engine.imports import EngineError, import_path

logger = logging.getLogger(__name__)

CLASSES: dict[str, type[Stopper]] = {
    "trial_plateau": TrialPlateauStopper,
    "experiment_plateau": ExperimentPlateauStopper,
    "maximum_iteration": MaximumIterationStopper,
    "timeout": TimeoutStopper,
}


class Thresholds(Stopper):
    """Stops a trial once one of its metrics reaches a threshold: ``above`` once ``result[metric] >= value``,
    ``below`` once ``result[metric] <= value``. Metrics are looked up in the flattened result (``"a/b"``), and a
    result without the metric does not stop the trial, as with Tune's dict form."""

    def __init__(self, criteria: list[tuple[str, str, float]]) -> None:
        self.criteria = list(criteria)
        self._warned: set[str] = set()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        flat = flatten_dict(result)
        for metric, direction, value in self.criteria:
            if metric not in flat:
                if metric not in self._warned:
                    self._warned.add(metric)
                    logger.warning(
                        "stop criterion %r not found in the result of trial %s (keys: %s); it stops no trial until "
                        "a result has it",
                        metric,
                        trial_id,
                        sorted(flat)[:20],
                    )
                continue
            reached = flat[metric] >= value if direction == "above" else flat[metric] <= value
            if reached:
                return True
        return False

    def stop_all(self) -> bool:
        return False


def build_stop(spec: ExperimentSpec) -> dict[str, Any] | Stopper | None:
    """What ``RunConfig(stop=...)`` gets for the spec's ``stop``."""
    stop = spec.stop
    if not stop:
        return None
    if isinstance(stop, Mapping):
        return dict(stop)  # Tune's own form: result[key] >= value
    criteria: list[tuple[str, str, float]] = []
    stoppers: list[Stopper] = []
    for i, entry in enumerate(stop):
        if is_threshold(entry):
            direction = "above" if "above" in entry else "below"
            criteria.append((entry["metric"], direction, entry[direction]))
        elif "factory" in entry:
            stoppers.append(build_custom_stopper(entry, f"stop[{i}]"))
        else:
            stoppers.append(build_stopper(spec, entry, f"stop[{i}]"))
    if criteria:
        stoppers.insert(0, Thresholds(criteria))
    return stoppers[0] if len(stoppers) == 1 else CombinedStopper(*stoppers)


def build_stopper(spec: ExperimentSpec, entry: Mapping[str, Any], where: str) -> Stopper:
    """One of Tune's stoppers by name; the plateau stoppers' metric and mode default to the spec's."""
    name = stopper_name(entry["name"])
    cls = CLASSES[name]
    args = dict(entry.get("args") or {})
    if name in ("trial_plateau", "experiment_plateau"):
        args.setdefault("metric", spec.metric)
        args.setdefault("mode", spec.mode)
    if name == "experiment_plateau" and "std" in args:
        args["std"] = float(args["std"])  # Tune refuses an int (isinstance(std, float)); JSON writes 1.0 as 1
    compat.check_arguments(cls, args, f"{where} ({STOPPER_CLASSES[name]})")
    return cls(**args)


def build_custom_stopper(entry: Mapping[str, Any], where: str) -> Stopper:
    """A custom stopper from its import path: a ``Stopper`` subclass called with ``args``, a Stopper object, or a
    function ``(trial_id, result) -> bool`` (Tune's function stopper)."""
    path = entry["factory"]
    args = dict(entry.get("args") or {})
    obj = import_path(path, f"{where}.factory")
    if inspect.isclass(obj) and issubclass(obj, Stopper):
        compat.check_arguments(obj, args, f"{where} ({path})")
        return obj(**args)
    if args:
        raise EngineError(
            f"{where}.args: {path!r} is a {type(obj).__name__}, and only a tune.Stopper subclass is called with args; "
            "drop args, or name the class"
        )
    if isinstance(obj, Stopper):
        return obj
    if callable(obj) and not inspect.isclass(obj):
        return FunctionStopper(obj)
    raise EngineError(
        f"{where}.factory {path!r} is {type(obj).__name__} {obj!r:.80}: a stopper is a tune.Stopper subclass or "
        "object, or a function (trial_id, result) -> bool"
    )
