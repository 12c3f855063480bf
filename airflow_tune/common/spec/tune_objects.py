"""Tune's own sample objects in a search space, as the spec's JSON form, and what a JSON spec cannot carry.

A DAG file may write its ``param_space`` as Tune writes it (``{"lr": tune.loguniform(1e-4, 1e-1)}``, at any depth,
in lists and in a choice's values). :func:`space_from_tune` gives the spec's JSON form of each object, read from the
object's attributes (a domain's ``lower``/``upper``, its sampler's ``mean``/``sd``, a ``Quantized`` sampler's ``q``,
a ``Categorical``'s ``categories``), so both forms give one spec and one fingerprint, and the engine builds the same
domain back from it:

==============================================  =================================================
Tune object                                     spec
==============================================  =================================================
``tune.uniform(0, 1)``                          ``{"uniform": [0, 1]}``
``tune.quniform(0, 1, 0.1)``                    ``{"quniform": [0, 1, 0.1]}``
``tune.loguniform(1e-4, 0.1, base=10)``         ``{"loguniform": [0.0001, 0.1]}``
``tune.qloguniform(1e-3, 1, 1e-3)``             ``{"qloguniform": [0.001, 1, 0.001]}``
``tune.randn()``                                ``{"randn": [0.0, 1.0]}``
``tune.qrandn(100, 20, 0.5)``                   ``{"qrandn": [100, 20, 0.5]}``
``tune.randint(1, 10)``                         ``{"randint": [1, 10]}``
``tune.qrandint(0, 100)``                       ``{"qrandint": [0, 100, 1]}``
``tune.lograndint(1, 1000)``                    ``{"lograndint": [1, 1000]}``
``tune.qlograndint(1, 1024, 2)``                ``{"qlograndint": [1, 1024, 2]}``
``tune.choice(["a", tune.uniform(0, 1)])``      ``{"choice": ["a", {"uniform": [0, 1]}]}``
``tune.grid_search([16, 32])``                  ``{"grid_search": [16, 32]}`` (Tune's own form already)
==============================================  =================================================

Every argument is written out, a default one too (``qrandint``'s q of 1, ``randn``'s mean and sd), except a log
``base``: Ray 2.50 and later no longer keep it on the object (it changes nothing: a log-uniform distribution is the
same in any base), and the engine drops it anyway. numpy numbers become Python numbers.

What a JSON spec cannot carry (a ``sample_from`` with a function, a Tune domain of another kind, a numpy array, any
other object) is left as it is by :func:`space_from_tune` and named by :func:`not_carried`, which the spec's checks
run, with the fix.

Imports neither airflow nor ray: an object is a Tune sample object only if Ray's ``ray.tune.search.sample`` module
is loaded already (it is, whenever such an object exists), so reading a DAG file stays cheap.
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["SAMPLE_MODULE", "is_tune_object", "not_carried", "space_from_tune", "tune_form"]

#: The module of Tune's sample objects (``Domain``, ``Float``, ``Integer``, ``Categorical``, ``Function``).
SAMPLE_MODULE = "ray.tune.search.sample"

_JSON_SCALARS = (str, int, float, bool, type(None))


class _NotCarried(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix


def _loaded(name: str) -> Any:
    """The module ``name`` when something in this process has imported it, else None (it is never imported here).

    Imported again rather than read from ``sys.modules``: a module another thread is still initialising is already
    there, half-built (numpy without ``bool_``), and the import waits for that thread to finish it."""
    return importlib.import_module(name) if name in sys.modules else None


def _sample_module() -> Any:
    return _loaded(SAMPLE_MODULE)


def is_tune_object(value: Any) -> bool:
    """Whether ``value`` is one of Tune's sample objects (a ``Domain``), without importing ray."""
    sample = _sample_module()
    return sample is not None and isinstance(value, sample.Domain)


def _numpy_number(value: Any) -> Any:
    """A numpy scalar number or boolean as the Python value it holds; anything else as it is."""
    numpy = _loaded("numpy")
    if numpy is not None and isinstance(value, (numpy.bool_, numpy.integer, numpy.floating)):
        return value.item()
    if isinstance(value, float) and type(value) is not float:  # a float subclass (numpy.float64 is one)
        return float(value)
    return value


def space_from_tune(value: Any) -> Any:
    """``value`` (a search space or any part of one) with every Tune sample object in it, at any depth, as the spec's
    JSON form, tuples as lists and numpy numbers as Python numbers. A string (a template) stays as it is, and so does
    what the spec cannot carry (for the spec's checks to name: :func:`not_carried`)."""
    if isinstance(value, Mapping):
        return {key: space_from_tune(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [space_from_tune(child) for child in value]
    value = _numpy_number(value)
    if isinstance(value, _JSON_SCALARS) or not is_tune_object(value):
        return value
    try:
        return tune_form(value)
    except _NotCarried:
        return value


def tune_form(domain: Any) -> Any:
    """The spec's JSON form of one Tune sample object (its values converted too); raises ``_NotCarried`` for one the
    spec has no form for."""
    sample = _sample_module()
    kind = type(domain)
    sampler = domain.sampler
    q = None
    if type(sampler) is sample.Quantized:
        q, sampler = _numpy_number(sampler.q), sampler.sampler
    if kind is sample.Function:
        raise _function_not_carried(domain)
    if kind is sample.Categorical and q is None:
        categories = [space_from_tune(c) for c in domain.categories]
        if sampler is None or type(sampler) is sample.Categorical._Uniform:
            return {"choice": categories}
        if type(sampler) is sample.Grid:
            return {"grid_search": categories}
    bounds = (
        [_numpy_number(domain.lower), _numpy_number(domain.upper)] if kind in (sample.Float, sample.Integer) else []
    )
    name: str | None = None
    args: list[Any] = []
    if kind is sample.Float:
        if sampler is None or type(sampler) is sample.Float._Uniform:
            name, args = "uniform", bounds
        elif type(sampler) is sample.Float._LogUniform:
            name, args = "loguniform", bounds
        elif type(sampler) is sample.Float._Normal and all(b is None or math.isinf(b) for b in bounds):
            name, args = "randn", [_numpy_number(sampler.mean), _numpy_number(sampler.sd)]
    elif kind is sample.Integer:
        if sampler is None or type(sampler) is sample.Integer._Uniform:
            name, args = "randint", bounds
        elif type(sampler) is sample.Integer._LogUniform:
            name, args = "lograndint", bounds
    if name is None:
        raise _NotCarried(
            f"a Ray Tune {kind.__module__}.{kind.__qualname__} sampled by {type(sampler).__qualname__}"
            + (f" quantized by {q}" if q is not None else "")
            + ", which the spec has no form for",
            "write one of Tune's primitives (tune.uniform, quniform, loguniform, qloguniform, randn, qrandn, randint, "
            "qrandint, lograndint, qlograndint, choice, grid_search) or its JSON form",
        )
    return {f"q{name}": [*args, q]} if q is not None else {name: args}


def _function_not_carried(domain: Any) -> _NotCarried:
    func = getattr(domain, "func", None)
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", "")
    example = "package.module:function"
    if (
        inspect.isfunction(func)
        and isinstance(module, str)
        and module not in ("__main__", "builtins")
        and not module.startswith("unusual_prefix_")  # Airflow's name for a DAG file's module
        and qualname
        and "<" not in qualname
    ):
        example = f"{module}:{qualname}"
    return _NotCarried(
        f"a {SAMPLE_MODULE}.Function (tune.sample_from with a function) cannot travel in the spec, which is JSON",
        f'write {{"sample_from": "{example}"}} naming it by import path, in a module the cluster imports (shipped '
        "with py_modules or working_dir); it receives the config",
    )


def not_carried(value: Any, path: str) -> list[tuple[str, Any, str, str]]:
    """Every value below ``value`` that a JSON spec cannot carry, with its path, why and what to write instead,
    sorted by path. Mapping keys are left to the spec's own checks."""
    found: list[tuple[str, Any, str, str]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
        elif not isinstance(node, _JSON_SCALARS):
            problem, fix = _why_not_carried(node)
            found.append((where, node, problem, fix))
    return sorted(found, key=lambda item: item[0])


def _why_not_carried(node: Any) -> tuple[str, str]:
    kind = type(node)
    if is_tune_object(node):
        try:
            form = tune_form(node)
        except _NotCarried as exc:
            return exc.problem, exc.fix
        return (
            f"a Ray Tune {kind.__module__}.{kind.__qualname__}: a spec holds its JSON form",
            f"write {_short(form)} (RayTuneOperator converts Tune's objects itself)",
        )
    name = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
    if name == "numpy.ndarray":
        return (
            "a numpy.ndarray is not JSON",
            'write a list instead (value.tolist()), or {"choice": value.tolist()} to sample from its values',
        )
    if _numpy_number(node) is not node:
        return f"a {name} is not a JSON number", "write it as a Python number: int(value), float(value) or bool(value)"
    return (
        f"a value of type {name} is not JSON: the spec carries objects, lists, strings, numbers, booleans and "
        "null, and Tune's sample objects as their JSON form",
        "write the value as JSON (e.g. a list for a set or array, a string for a path), or build it in the trainable "
        "from a JSON value",
    )


def _short(form: Any) -> str:
    import json

    text = json.dumps(form, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."
