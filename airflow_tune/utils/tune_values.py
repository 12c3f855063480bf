"""Tune's own objects for the operator's data arguments, as the spec's JSON form, or refused naming the form to write.

A Tune user writes ``tune.PlacementGroupFactory([...])`` for per-trial bundles and may write ``time_budget_s`` as a
``datetime.timedelta``; both are data, so they become the JSON the spec holds (one spec and fingerprint for both
forms). A scheduler or searcher object is built code whose arguments the spec cannot read back: it is refused with
the spec's forms. Imports no ray (parsing a DAG file stays cheap): an object is recognised by its type's module and
attributes.
"""

from __future__ import annotations

import datetime
import inspect
from typing import Any

from airflow_tune.common.spec.callbacks import LOGGERS

__all__ = [
    "refuse_tune_part",
    "resources_from_tune",
    "resources_left_behind",
    "resources_of_trainable",
    "seconds_from_tune",
]


def _tune_type(value: Any) -> str | None:
    """``ClassName`` when ``value`` is an object of one of Ray Tune's (or Ray AIR's) classes, else None."""
    module = type(value).__module__ or ""
    return type(value).__name__ if module.startswith(("ray.tune.", "ray.air.")) else None


def seconds_from_tune(value: Any) -> Any:
    """A ``datetime.timedelta`` (which Tune's ``time_budget_s`` takes) as its seconds; any other value as it is."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def resources_from_tune(value: Any) -> Any:
    """A ``tune.PlacementGroupFactory`` as the spec's ``{"bundles": [...], "strategy": ...}`` (an empty head bundle
    kept first, as Tune takes it); any other value as it is.

    Tune's factory is callable, and Airflow's renderer calls a callable found in a templated argument: read it here,
    before rendering. Other ``placement_group`` arguments (``lifetime``, ...) are refused: the spec has no field for
    them.
    """
    if _tune_type(value) not in ("PlacementGroupFactory", "ResourceRequest"):
        return value
    bound = getattr(getattr(value, "_bound", None), "arguments", {}) or {}
    extra = sorted(k for k in bound if k not in ("bundles", "strategy"))
    if extra:
        raise TypeError(
            f"resources_per_trial = {value!r}: the PlacementGroupFactory's {', '.join(extra)} cannot be carried (the "
            "spec takes bundles and strategy only); drop them, or give the bundles as a list of dicts"
        )
    bundles = [{k: v for k, v in dict(b).items() if v} for b in value.bundles]
    if getattr(value, "head_bundle_is_empty", False):
        bundles = [{}, *bundles]
    return {"bundles": bundles, "strategy": value.strategy}


def resources_of_trainable(trainable: Any, resources_per_trial: Any) -> Any:
    """``resources_per_trial``, or the resources ``tune.with_resources(fn, ...)`` set on a function trainable.

    Tune's ``with_resources`` sets them as an attribute of the function itself, which an import path does not carry
    (the cluster imports the function afresh): they become the spec's resources, as Tune would run them. Resources
    given as a function of the config stay on the trainable (see :func:`resources_left_behind`).
    """
    carried = getattr(trainable, "_resources", None) if not isinstance(trainable, (str, type)) else None
    converted = resources_from_tune(carried)
    if carried is None or converted is carried:
        return resources_per_trial
    if resources_per_trial is not None:
        raise ValueError(
            f"trainable {getattr(trainable, '__name__', trainable)!r} carries resources from tune.with_resources and "
            f"resources_per_trial = {resources_per_trial!r} gives others; give them in one place"
        )
    return converted


def resources_left_behind(trainable: Any, by_value: bool) -> None:
    """Refuse resources given to ``tune.with_resources`` as a function of the config on a trainable that travels by
    import path: the cluster imports the function without them."""
    carried = getattr(trainable, "_resources", None) if not isinstance(trainable, (str, type)) else None
    if by_value or not callable(carried) or resources_from_tune(carried) is not carried:
        return  # nothing, a PlacementGroupFactory (in the spec's resources), or travelling with the trainable
    raise TypeError(
        f"trainable {getattr(trainable, '__name__', trainable)!r}: tune.with_resources with a function of the config "
        "is lost on a trainable the cluster imports by name; give the resources as a dict or a PlacementGroupFactory "
        "(or resources_per_trial), or define the trainable in the DAG file"
    )


def refuse_tune_part(name: str, value: Any) -> None:
    """Refuse a Tune scheduler or searcher object given as ``scheduler``/``search``, naming the forms to write."""
    kind = _tune_type(value)
    if kind is None:
        return
    example = _EXAMPLES.get(name, "{'name': ..., 'args': {...}}")
    raise TypeError(
        f"{name} = {kind}(...): a Tune {name} object is not taken (the spec cannot read its arguments back); write "
        f"it by name with JSON arguments, {name}={example}, or build the object in a factory, a function in a module "
        f"on the cluster: {name}={{'factory': 'pkg.mod:make', 'args': {{...}}}}"
    )


_EXAMPLES = {
    "scheduler": "{'name': 'asha', 'args': {'max_t': 10, 'grace_period': 1}}",
    "search": "{'name': 'optuna', 'args': {'seed': 1}}",
}


def refuse_function_checkpoints(trainable: Any, checkpoint: Any) -> None:
    """Refuse ``checkpoint.frequency``/``at_end`` for a trainable that cannot save: a function, which Tune's
    ``Experiment`` refuses when the experiment starts, or a ``tune.Trainable`` subclass without ``save_checkpoint``,
    whose every trial Tune fails at its first checkpoint (for an import path the engine refuses both on the cluster)."""
    if not (checkpoint.frequency or checkpoint.at_end):
        return
    where = f"checkpoint = {{'frequency': {checkpoint.frequency}, 'at_end': {checkpoint.at_end}}}"
    if inspect.isfunction(trainable):
        raise ValueError(
            f"{where}: frequency and at_end apply to Class API trainables only, and the trainable "
            f"{trainable.__name__!r} is a function (Tune refuses them when the experiment starts); report checkpoints "
            "with tune.report(metrics, checkpoint=...) and drop these fields"
        )
    base = next(
        (c for c in getattr(trainable, "__mro__", ()) if c.__name__ == "Trainable" and c.__module__.startswith("ray.")),
        None,
    )
    if base is not None and getattr(trainable, "save_checkpoint", None) is base.__dict__.get("save_checkpoint"):
        raise ValueError(
            f"{where}: frequency and at_end ask {trainable.__name__!r} for checkpoints, and it does not implement "
            "save_checkpoint/load_checkpoint (Tune errs every trial at its first checkpoint: NotImplementedError); "
            "implement them, or drop these fields"
        )


#: Tune's logger callbacks by class name, with the spec's name for each.
_LOGGER_NAMES = {path.rsplit(":", 1)[1]: name for name, (path, *_) in LOGGERS.items()}


def refuse_tune_callbacks(callbacks: Any) -> None:
    """Refuse a ``tune.Callback`` object or class in ``callbacks`` (Tune's ``RunConfig(callbacks=[...])`` form),
    naming the spec's form for it: Tune's loggers by name with JSON arguments, others by import path."""
    for i, entry in enumerate(callbacks if isinstance(callbacks, (list, tuple)) else []):
        cls = entry if isinstance(entry, type) else type(entry)
        if isinstance(entry, (str, dict)) or not any(c.__name__ == "Callback" for c in cls.__mro__):
            continue
        name = _LOGGER_NAMES.get(cls.__name__)
        fix = (
            f"write Tune's logger by name, {name!r} or {{'name': {name!r}, 'args': {{...}}}}"
            if name
            else f"write its class by import path, {{'factory': '{cls.__module__}:{cls.__qualname__}', 'args': "
            "{...}} (a module the cluster imports; the class is called with args)"
        )
        raise TypeError(
            f"callbacks[{i}] = {cls.__name__}{'' if isinstance(entry, type) else '(...)'}: a callback object or class "
            f"is not taken (the spec holds callbacks as data it can check and store); {fix}"
        )
