"""The spec's ``stop``: when Tune stops a trial, or the whole experiment, as data.

Two forms:

- ``{"training_iteration": 10}``: Tune's own dict, passed to ``tune.RunConfig(stop=...)`` as it is: a trial stops
  once ``result[key] >= value`` (a boolean such as ``{"done": true}`` the same way; nested keys as ``"a/b"``).
- a list of criteria, any one of which stops (Tune's ``CombinedStopper``, as a list given to ``RunConfig(stop=)``):
  ``{"metric": "loss", "below": 0.1}`` stops a trial once ``loss <= 0.1``, ``{"metric": "acc", "above": 0.9}`` once
  ``acc >= 0.9`` (Tune's dict semantics; a trial that never reports the metric is not stopped by it), and Tune's
  stoppers by name with their arguments: ``{"name": "trial_plateau", "args": {"std": 0.01}}``, and custom stoppers as
  code: ``{"factory": "pkg.mod:MyStopper", "args": {...}}`` (a ``tune.Stopper`` subclass, called with ``args``; a
  Stopper instance or a function ``(trial_id, result) -> bool``, Tune's function stopper, taken as it is), or just
  ``"pkg.mod:MyStopper"``, alone or in the list. A code reference is code: only the DAG file (where a stopper object
  or a stop function becomes this form, see :mod:`airflow_tune.utils.shipped_objects`) or the deployment's allow-list
  may name one (:func:`~airflow_tune.common.spec.code_references`).

The stoppers' arguments are checked against :data:`STOPPERS`, read from Ray 2.60's signatures (the same in 2.43).
The plateau stoppers' ``metric`` and ``mode`` default to the spec's own, where Tune's default to none and ``"min"``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_tune.common.spec.arguments import check_named_args, not_json
from airflow_tune.common.spec.errors import Errors, did_you_mean, is_int, is_number
from airflow_tune.common.spec.space import IMPORT_PATH

#: Tune's stoppers by name (``ray.tune.stopper``), each argument with its kind; ``metric``/``mode`` default to the
#: spec's.
STOPPERS: dict[str, dict[str, str]] = {
    "trial_plateau": {
        "metric": "metric",
        "std": "positive",
        "num_results": "count1",
        "grace_period": "count",
        "metric_threshold": "number_or_null",
        "mode": "mode_or_null",
    },
    "experiment_plateau": {"metric": "metric", "std": "positive", "top": "top", "mode": "mode", "patience": "count"},
    "maximum_iteration": {"max_iter": "count1"},
    "timeout": {"timeout": "positive"},
}
STOPPER_CLASSES = {
    "trial_plateau": "TrialPlateauStopper",
    "experiment_plateau": "ExperimentPlateauStopper",
    "maximum_iteration": "MaximumIterationStopper",
    "timeout": "TimeoutStopper",
}
REQUIRED_ARGS = {"maximum_iteration": ("max_iter",), "timeout": ("timeout",)}
#: Stoppers that stop the whole experiment (``stop_all``), not one trial.
EXPERIMENT_STOPPERS = ("experiment_plateau", "timeout")
STOPPER_ALIASES = {
    **{cls.lower(): name for name, cls in STOPPER_CLASSES.items()},
    "plateau": "trial_plateau",
    "max_iter": "maximum_iteration",
    "max_iterations": "maximum_iteration",
}
THRESHOLDS = ("above", "below")
_THRESHOLD_KEYS = ("metric", *THRESHOLDS)
_STOPPER_KEYS = ("name", "args")
_FACTORY_KEYS = ("factory", "args")
_EXAMPLE = '[{"metric": "loss", "below": 0.1}, {"name": "trial_plateau", "args": {"std": 0.01}}]'

_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "metric": ("a metric name", lambda v: isinstance(v, str) and bool(v.strip())),
    "positive": ("a number > 0", lambda v: is_number(v) and v > 0),
    "count": ("an integer >= 0", lambda v: is_int(v) and v >= 0),
    "count1": ("an integer >= 1", lambda v: is_int(v) and v >= 1),
    "top": ("an integer >= 2", lambda v: is_int(v) and v >= 2),
    "number_or_null": ("a number or null", lambda v: v is None or is_number(v)),
    "mode": ('"min" or "max"', lambda v: v in ("min", "max")),
    "mode_or_null": ('"min", "max" or null', lambda v: v in ("min", "max", None)),
}


def stopper_name(name: Any) -> str:
    """The canonical name of a stopper given by ``name`` (an alias or Tune's class name, any case)."""
    low = str(name).lower()
    return STOPPER_ALIASES.get(low, low)


def is_threshold(entry: Mapping[str, Any]) -> bool:
    return "metric" in entry and "name" not in entry and "factory" not in entry


def normalize_stop(stop: Any) -> Any:
    """``stop`` with each custom stopper in its full form ``{"factory": path, "args": {...}}``: a string (alone or in
    the list) is one; Tune's two forms and anything else are returned as they are."""
    if isinstance(stop, str):
        return [{"factory": stop, "args": {}}]
    if not isinstance(stop, list):
        return stop
    return [
        {"factory": e, "args": {}}
        if isinstance(e, str)
        else ({"args": {}, **e} if isinstance(e, Mapping) and "factory" in e else e)
        for e in stop
    ]


def stop_code_references(stop: Any) -> list[tuple[str, Any]]:
    """The custom stoppers' import paths in ``stop`` (any form), with their fields."""
    full = normalize_stop(stop)
    entries = enumerate(full if isinstance(full, list) else [])
    return [(f"stop[{i}].factory", e["factory"]) for i, e in entries if isinstance(e, Mapping) and "factory" in e]


def experiment_stoppers(stop: Any) -> list[str]:
    """The stoppers in ``stop`` that end (or, for custom ones, may end) the whole experiment: ``timeout``,
    ``experiment_plateau``, and each custom stopper's path (its ``stop_all`` is its own)."""
    full = normalize_stop(stop)
    if not isinstance(full, list):
        return []
    names = [stopper_name(e["name"]) for e in full if isinstance(e, Mapping) and "name" in e]
    custom = [str(e["factory"]) for e in full if isinstance(e, Mapping) and "factory" in e]
    return [n for n in names if n in EXPERIMENT_STOPPERS] + custom


def check_stop(stop: Any, errors: Errors) -> None:
    """``stop`` in either form; every problem is added to ``errors``."""
    if isinstance(stop, str) and IMPORT_PATH.match(stop):
        return
    if isinstance(stop, Mapping) and stop:
        _check_dict(stop, errors)
    elif isinstance(stop, list) and stop:
        for i, entry in enumerate(stop):
            _check_entry(entry, f"stop[{i}]", errors)
    else:
        errors.add(
            "stop",
            stop,
            "must be an object of metric thresholds or a non-empty list of criteria (or a stopper's import path)",
            f'write {{"training_iteration": 10}} or {_EXAMPLE}, a custom stopper\'s import path "pkg.mod:MyStopper", '
            "or null for no stop criteria",
        )


def _check_dict(stop: Mapping[str, Any], errors: Errors) -> None:
    if isinstance(stop.get("metric"), str) or isinstance(stop.get("name"), str):
        # One criterion of the list form written without its list.
        errors.add(
            "stop", stop, "is one criterion of the list form", f"put it in a list: stop=[{{...}}], e.g. {_EXAMPLE}"
        )
        return
    for k, v in stop.items():
        # Tune stops a trial once result[k] >= v; a boolean such as {"done": True} works the same way.
        if not (is_number(v) or isinstance(v, bool)):
            errors.add(
                f"stop.{k}",
                v,
                "must be a number or true/false",
                'give the value at which a trial stops (result >= value), or use the list form for "below"',
            )


def _check_entry(entry: Any, where: str, errors: Errors) -> None:
    if isinstance(entry, str):
        _check_factory({"factory": entry, "args": {}}, where, errors)
        return
    if not isinstance(entry, Mapping):
        errors.add(
            where,
            entry,
            "must be an object or a custom stopper's import path",
            f'write each criterion as an object, e.g. {_EXAMPLE}, or "pkg.mod:MyStopper"',
        )
        return
    if is_threshold(entry):
        _check_threshold(entry, where, errors)
    elif "name" in entry:
        _check_stopper(entry, where, errors)
    elif "factory" in entry:
        _check_factory(entry, where, errors)
    else:
        errors.add(
            where,
            entry,
            "is neither a threshold nor a stopper",
            'write {"metric": "loss", "below": 0.1}, {"name": "trial_plateau", "args": {...}}, or a custom stopper '
            '{"factory": "pkg.mod:MyStopper", "args": {...}} (a tune.Stopper subclass, or a function (trial_id, '
            "result) -> bool)",
        )


def _check_factory(entry: Mapping[str, Any], where: str, errors: Errors) -> None:
    if _unknown_keys(entry, _FACTORY_KEYS, where, errors):
        return
    path = entry["factory"]
    if not isinstance(path, str) or not IMPORT_PATH.match(path):
        errors.add(
            f"{where}.factory",
            path,
            "not a stopper's import path",
            'write "pkg.mod:MyStopper" (a tune.Stopper subclass, a Stopper object, or a function (trial_id, result) '
            "-> bool, importable on the cluster), or pass the object itself in the DAG file",
        )
    args = entry.get("args", {})
    if not isinstance(args, Mapping):
        errors.add(f"{where}.args", args, "must be a JSON object", "pass the stopper class's keyword arguments")
        return
    for arg, value in args.items():
        for w, node in not_json(value, f"{where}.args.{arg}"):
            errors.add(w, node, f"is a Python {type(node).__name__}, not JSON data", "pass JSON values")


def _unknown_keys(entry: Mapping[str, Any], known: tuple[str, ...], where: str, errors: Errors) -> bool:
    bad = [k for k in entry if k not in known]
    for k in bad:
        close = did_you_mean(k, known)
        hint = f"did you mean {close!r}? " if close else ""
        errors.add(f"{where}.{k}", entry[k], "unknown key", f"{hint}this criterion takes {', '.join(known)}")
    return bool(bad)


def _check_threshold(entry: Mapping[str, Any], where: str, errors: Errors) -> None:
    if _unknown_keys(entry, _THRESHOLD_KEYS, where, errors):
        return
    metric = entry["metric"]
    if not _KINDS["metric"][1](metric):
        errors.add(
            f"{where}.metric", metric, "must be a metric name", 'give the key the trainable reports, e.g. "loss"'
        )
    given = [k for k in THRESHOLDS if k in entry]
    if len(given) != 1:
        errors.add(
            where,
            entry,
            "needs exactly one of above or below",
            'write {"metric": "loss", "below": 0.1} (stops once loss <= 0.1) or "above" (stops once >= the value)',
        )
        return
    value = entry[given[0]]
    if not is_number(value):
        errors.add(f"{where}.{given[0]}", value, "must be a number", "give the value at which a trial stops")


def _check_stopper(entry: Mapping[str, Any], where: str, errors: Errors) -> None:
    if _unknown_keys(entry, _STOPPER_KEYS, where, errors):
        return
    name = stopper_name(entry["name"])
    if name not in STOPPERS:
        close = did_you_mean(entry["name"], list(STOPPERS))
        hint = f"did you mean {close!r}? " if close else ""
        errors.add(f"{where}.name", entry["name"], "unknown stopper", f"{hint}use one of {', '.join(STOPPERS)}")
        return
    args = entry.get("args", {})
    if not isinstance(args, Mapping):
        errors.add(
            f"{where}.args", args, "must be a JSON object", "pass the stopper's keyword arguments as {name: value}"
        )
        return
    odd = [(w, node) for arg, value in args.items() for w, node in not_json(value, f"{where}.args.{arg}")]
    for w, node in odd:
        errors.add(w, node, f"is a Python {type(node).__name__}, not JSON data", "pass JSON values")
    kinds = STOPPERS[name]
    known: dict[str, str | None] = dict.fromkeys(kinds)
    check_named_args(
        "stop", STOPPER_CLASSES[name], args, errors, set_by_spec={}, code={}, known=known, at=f"{where}.args"
    )
    for arg, value in args.items():
        if arg in kinds and not odd:
            what, ok = _KINDS[kinds[arg]]
            if not ok(value):
                errors.add(f"{where}.args.{arg}", value, f"must be {what}", f"give {what}")
    if name == "trial_plateau" and args.get("metric_threshold") is not None and "mode" in args and not args["mode"]:
        errors.add(
            f"{where}.args.mode",
            args["mode"],
            "TrialPlateauStopper needs a mode with a metric_threshold",
            'give "min" or "max", or leave mode out for the spec\'s mode',
        )
    for arg in REQUIRED_ARGS.get(name, ()):
        if arg not in args:
            errors.add(
                f"{where}.args",
                args,
                f"{STOPPER_CLASSES[name]} needs {arg}",
                f'write {{"name": "{name}", "args": {{"{arg}": ...}}}} ({_KINDS[kinds[arg]][0]})',
            )
