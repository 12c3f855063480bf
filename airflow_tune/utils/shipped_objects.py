"""Tune's code objects written in the DAG file, besides the trainable: a stopper object, a stopper class or a stop
function ``(trial_id, result) -> bool`` in ``stop``; ``tune.sample_from(fn)`` in ``param_space`` and in PBT's
``hyperparam_mutations`` (where a bare function is a mutation too, as Tune allows); ``tune.with_parameters(fn,
**data)`` as the trainable.

Each is replaced, when the operator is built, by the spec's JSON form naming an import path: the object's own when the
cluster can import it by name (the JSON form a DAG file could write instead, so both give one spec), else the shipped
package's attribute ``<kind>_<digest>`` (:data:`~airflow_tune.utils.shipping.SHIPPED_PACKAGE`), the digest of its
code (and an instance's state), so an edited function is another experiment. The objects themselves stay out of the
templated arguments (Airflow's renderer would call a callable one with ``context=``) and are pickled by value only
when the job is submitted. They are code the DAG file wrote: their paths count as written there, and the same path
from a template, a Param, a conf or an XCom is refused (:mod:`airflow_tune.trust.code`).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.tune_objects import is_tune_object, space_from_tune
from airflow_tune.utils import with_parameters
from airflow_tune.utils.shipping import (
    SHIPPED_PACKAGE,
    TrainableCode,
    _importable_by_name,
    _pickle_by_value,
    code_digest,
    trainable_code,
)

__all__ = [
    "code_in_arguments",
    "describe",
    "object_code",
    "object_path",
    "trainable_code_of",
    "tune_stopper_form",
    "with_parameters_arguments",
    "with_parameters_code",
]


def describe(obj: Any) -> str:
    """``module:qualname`` of a function or class, of an instance's class, or of what ``tune.with_parameters``
    wrapped, for messages."""
    if with_parameters.is_with_parameters(obj):
        wrapped = with_parameters.unwrap(obj)
        return f"tune.with_parameters({describe(wrapped.trainable)}, {', '.join(wrapped.parameters)})"
    if not hasattr(obj, "__qualname__"):
        return f"an instance of {describe(type(obj))}"
    return f"{getattr(obj, '__module__', '?')}:{obj.__qualname__}"


def trainable_code_of(obj: Any) -> TrainableCode:
    """How the trainable object travels: :func:`~airflow_tune.utils.shipping.trainable_code`, and
    ``tune.with_parameters(fn, **data)`` always by value (:func:`with_parameters_code`)."""
    if with_parameters.is_with_parameters(obj):
        return with_parameters_code(obj)
    return trainable_code(obj)


def with_parameters_arguments(obj: Any) -> list[str]:
    """The names of the arguments ``tune.with_parameters`` gave ``obj``; none for another object."""
    return list(with_parameters.unwrap(obj).parameters) if with_parameters.is_with_parameters(obj) else []


def with_parameters_code(obj: Any) -> TrainableCode:
    """``tune.with_parameters(fn, **data)`` as a by-value trainable: the function and its arguments pickled
    together (:class:`~airflow_tune.common.shipped.WithParameters`); its digest is of the function's code and the
    arguments' data, so other data is another experiment, as another ``trainable_kwargs`` is.

    :raises TypeError: an argument cannot be pickled, naming it and what to pass instead.
    """
    wrapped = with_parameters.unwrap(obj)
    source = describe(obj)
    inner = wrapped.trainable
    module_name = getattr(inner, "__module__", None) or ""
    for key, value in wrapped.parameters.items():  # one by one, to name the argument that cannot travel
        try:
            _pickle_by_value(value, module_name, f"{source}'s argument {key}=")
        except TypeError as exc:
            raise TypeError(
                f"trainable = {source}: its argument {key}= (a {type(value).__name__}) cannot be pickled to ship it "
                f"with the job ({exc.__cause__!r}); pass data that pickles (lists, dicts, arrays, dataframes), or "
                "pass where to read it (a URI) and load it in the trainable"
            ) from exc
    payload = _pickle_by_value(wrapped, module_name, source)
    name = getattr(inner, "__name__", "")
    attr = name if name.isidentifier() and not name.startswith("_") else "trainable"
    code = _by_reference(inner) or code_digest(inner)
    data = _data_digest(wrapped.parameters)
    digest = "sha256:" + hashlib.sha256(f"{code}\n\x00{data}".encode()).hexdigest()
    return TrainableCode(source=source, import_path=f"{SHIPPED_PACKAGE}:{attr}", payload=payload, digest=digest)


def _by_reference(obj: Any) -> str | None:
    """``module:qualname`` when the cluster can import ``obj`` by that name (a module-level function or class of a
    module on the path), else None."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return None
    module_name = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", "") or ""
    nested = "<locals>" in qualname or "<lambda>" in qualname
    return f"{module_name}:{qualname}" if module_name and not nested and _importable_by_name(module_name) else None


def object_path(obj: Any, kind: str) -> str:
    """The import path the spec names for a code object written in the DAG file: its own when the cluster can import
    it by name, else the shipped package's attribute ``<kind>_<digest>``. Reads source, never pickles: cheap enough
    for parsing a DAG file."""
    path = _by_reference(obj)
    if path is not None:
        return path
    return f"{SHIPPED_PACKAGE}:{kind}_{object_digest(obj)[7:23]}"


def object_code(obj: Any, path: str) -> TrainableCode:
    """``obj`` ready to travel under ``path`` (from :func:`object_path`): pickled when the path is the shipped
    package's.

    :raises TypeError: cloudpickle cannot pickle it.
    """
    source = describe(obj)
    if not path.startswith(SHIPPED_PACKAGE + ":"):
        return TrainableCode(source=source, import_path=path)
    module_name = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None) or ""
    payload = _pickle_by_value(obj, module_name, source)
    return TrainableCode(source=source, import_path=path, payload=payload, digest=object_digest(obj))


def object_digest(obj: Any) -> str:
    """:func:`~airflow_tune.utils.shipping.code_digest` of a function or class; of an instance, its class's with its
    state."""
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return code_digest(obj)
    cls = type(obj)
    code = _by_reference(cls) or code_digest(cls)
    state = _data_digest(getattr(obj, "__dict__", {}))
    return "sha256:" + hashlib.sha256(f"{code}\n\x00{state}".encode()).hexdigest()


def _data_digest(value: Any) -> str:
    """A digest of data, the same in every process: its JSON when it has one (sorted keys; a set as its sorted
    members, whose order would otherwise follow the process's hash seed), else its pickle (Python's own), else its
    repr with addresses cut."""
    import json
    import pickle
    import re

    def members(obj: Any) -> Any:
        if isinstance(obj, (set, frozenset)):
            return {"<set>": sorted(obj, key=lambda member: (type(member).__name__, repr(member)))}
        raise TypeError(type(obj).__name__)

    try:
        text = json.dumps(value, sort_keys=True, default=members).encode()
    except (TypeError, ValueError):
        try:
            text = pickle.dumps(value, protocol=4)
        except Exception:
            text = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value)).encode()
    return hashlib.sha256(text).hexdigest()


# -- the operator's arguments -------------------------------------------------------------------------------------
def _is_code(value: Any) -> bool:
    return callable(value) and not isinstance(value, (str, Mapping, list, tuple)) and not is_tune_object(value)


def code_in_arguments(param_space: Any, scheduler: Any, stop: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``param_space``, ``scheduler`` and ``stop`` with every code object in them as its JSON form (Tune's sample
    objects too, in PBT's mutations as in the space), and the objects by the import path that names them."""
    objects: dict[str, Any] = {}

    def named(obj: Any, kind: str) -> str:
        path = object_path(obj, kind)
        objects[path] = obj
        return path

    def space(node: Any, mutation: bool) -> Any:
        if isinstance(node, Mapping):
            return {key: space(child, mutation) for key, child in node.items()}
        if isinstance(node, list):
            return [space(child, mutation) for child in node]
        if is_tune_object(node) and callable(getattr(node, "func", None)):  # tune.sample_from(fn)
            return {"sample_from": named(node.func, "sample_from")}
        if mutation and _is_code(node):  # Tune calls a bare function in hyperparam_mutations for a new value
            return {"sample_from": named(node, "mutation")}
        return node

    param_space = space(space_from_tune(param_space), False) if isinstance(param_space, Mapping) else param_space
    args = scheduler.get("args") if isinstance(scheduler, Mapping) else None
    if isinstance(args, Mapping) and isinstance(args.get("hyperparam_mutations"), Mapping):
        mutations = space(space_from_tune(args["hyperparam_mutations"]), True)
        scheduler = {**scheduler, "args": {**args, "hyperparam_mutations": mutations}}

    def stoppers(obj: Any) -> list[Any]:
        """One stop entry as the spec's entries: Tune's own stoppers by name (their JSON form), a CombinedStopper as
        its stoppers, Tune's FunctionStopper as its function, any other code as a custom stopper."""
        form = tune_stopper_form(obj)
        if form is not None:
            return [form]
        inner = _own_attribute(obj, "CombinedStopper", "_stoppers")
        if isinstance(inner, (list, tuple)):
            return [entry for stopper in inner for entry in stoppers(stopper)]
        function = _own_attribute(obj, "FunctionStopper", "_fn")
        target = function if callable(function) else obj
        return [{"factory": named(target, "stop"), "args": {}}] if _is_code(target) else [obj]

    if _is_code(stop):
        stop = stoppers(stop)
    elif isinstance(stop, (list, tuple)):
        stop = [entry for item in stop for entry in (stoppers(item) if _is_code(item) else [item])]
    return param_space, scheduler, stop, objects


#: Tune's stoppers (``ray.tune.stopper``) with a name in the spec: the name, and each argument with the attribute
#: that holds it (the same in Ray 2.43 to 2.60).
_TUNE_STOPPERS: dict[str, tuple[str, dict[str, str]]] = {
    "MaximumIterationStopper": ("maximum_iteration", {"max_iter": "_max_iter"}),
    "TimeoutStopper": ("timeout", {"timeout": "_timeout_seconds"}),
    "TrialPlateauStopper": (
        "trial_plateau",
        {
            "metric": "_metric",
            "std": "_std",
            "num_results": "_num_results",
            "grace_period": "_grace_period",
            "metric_threshold": "_metric_threshold",
            "mode": "_mode",
        },
    ),
    "ExperimentPlateauStopper": (
        "experiment_plateau",
        {"metric": "_metric", "std": "_std", "top": "_top", "mode": "_mode", "patience": "_patience"},
    ),
}


def _own_attribute(obj: Any, tune_class: str, attr: str) -> Any:
    """``obj.<attr>`` when ``obj`` is exactly Tune's ``tune_class`` (not a subclass, which may behave otherwise)."""
    kind = type(obj)
    if kind.__name__ != tune_class or not kind.__module__.startswith("ray.tune.stopper"):
        return None
    return getattr(obj, attr, None)


def tune_stopper_form(obj: Any) -> dict[str, Any] | None:
    """The spec's ``{"name": ..., "args": {...}}`` of one of Tune's own stoppers written as an object
    (``MaximumIterationStopper(5)``), every argument written out, so it gives the JSON form's spec; None for any
    other object. A timeout counts from the driver's start, as the JSON form's does."""
    kind = type(obj)
    known = _TUNE_STOPPERS.get(kind.__name__)
    if known is None or not kind.__module__.startswith("ray.tune.stopper"):
        return None
    name, attributes = known
    missing = object()
    args = {arg: getattr(obj, attr, missing) for arg, attr in attributes.items()}
    if any(value is missing for value in args.values()):
        return None
    return {"name": name, "args": args}
