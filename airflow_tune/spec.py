"""The experiment spec: everything a tuning experiment needs, as plain JSON, validated before anything is submitted.

This module imports neither airflow nor ray: the Airflow side validates with it at task time, the engine builds the
Tuner from it on the cluster. Every error names the field, the value and the fix.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal

from airflow_tune.contract import join_uri

SPEC_VERSION = 1

#: Search-space primitives and how many positional arguments each takes (min, max).
PRIMITIVES: dict[str, tuple[int, int]] = {
    "uniform": (2, 2),
    "quniform": (3, 3),
    "loguniform": (2, 3),
    "qloguniform": (3, 4),
    "randn": (0, 2),
    "qrandn": (3, 3),
    "randint": (2, 2),
    "qrandint": (2, 3),
    "lograndint": (2, 3),
    "qlograndint": (3, 4),
    "choice": (1, 1),
    "grid_search": (1, 1),
    "sample_from": (1, 1),
    "const": (1, 1),
}
_INT_PRIMITIVES = {"randint", "qrandint", "lograndint", "qlograndint"}
_LOG_PRIMITIVES = {"loguniform", "qloguniform", "lograndint", "qlograndint"}

#: Schedulers by name, with the keyword arguments Ray Tune 2.60 accepts (metric/mode come from the spec).
SCHEDULERS: dict[str, frozenset[str]] = {
    "fifo": frozenset(),
    "asha": frozenset({"time_attr", "max_t", "grace_period", "reduction_factor", "brackets", "stop_last_trials"}),
    "hyperband": frozenset({"time_attr", "max_t", "reduction_factor", "stop_last_trials"}),
    "median_stopping_rule": frozenset(
        {"time_attr", "grace_period", "min_samples_required", "min_time_slice", "hard_stop"}
    ),
    "pbt": frozenset(
        {
            "time_attr",
            "perturbation_interval",
            "burn_in_period",
            "hyperparam_mutations",
            "quantile_fraction",
            "resample_probability",
            "perturbation_factors",
            "log_config",
            "require_attrs",
            "synch",
        }
    ),
    "pb2": frozenset(
        {
            "time_attr",
            "perturbation_interval",
            "hyperparam_bounds",
            "quantile_fraction",
            "log_config",
            "require_attrs",
            "synch",
        }
    ),
}
SCHEDULER_ALIASES = {"async_hyperband": "asha", "ashascheduler": "asha", "median": "median_stopping_rule"}

#: Searchers by name and the package each needs on the cluster.
SEARCHERS: dict[str, str | None] = {
    "random": None,
    "grid": None,
    "optuna": "optuna",
    "hyperopt": "hyperopt",
    "bayesopt": "bayes_opt",
}
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs", "abfss", "az")
ERRORED_TRIAL_POLICIES = ("resume", "restart", "keep")
BEST_SCOPES = ("last", "all", "last-5-avg", "last-10-avg", "avg")

# ``\Z``, not ``$``: ``$`` also matches before a trailing newline, which would let "name\n" through.
IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z"
)
_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}\Z")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*\Z")


class SpecError(ValueError):
    """A spec that cannot run. ``errors`` lists every problem found, each naming the field, the value and the fix."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"invalid experiment spec ({len(errors)} problem{'s' if len(errors) > 1 else ''}):\n{lines}")

    def __reduce__(self) -> tuple[type[SpecError], tuple[list[str]]]:
        # Rebuild from the list, not from the formatted message (crossing a process keeps the message intact).
        return (type(self), (self.errors,))


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, default=repr) if not isinstance(value, str) else repr(value)
    except (TypeError, ValueError):  # e.g. a dict with non-string keys from a Python caller
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _did_you_mean(key: Any, known: Any) -> str | None:
    """The closest known name to a misspelt ``key``: case, underscores and small typos."""
    text = str(key)
    for k in known:
        if k.replace("_", "") == text.lower().replace("_", ""):
            return str(k)
    close = difflib.get_close_matches(text.lower(), list(known), n=1, cutoff=0.6)
    return close[0] if close else None


class _Errors:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, value: Any, problem: str, fix: str) -> None:
        self.items.append(f"{path} = {_show(value)}: {problem}; {fix}")


# --- search space -----------------------------------------------------------------------------------------------
def primitive_of(node: Any) -> str | None:
    """The primitive a search-space node names (``{"uniform": [0, 1]}`` -> ``"uniform"``), or None for a plain value."""
    if isinstance(node, Mapping) and len(node) == 1:
        (key,) = node.keys()
        if key in PRIMITIVES:
            return str(key)
    return None


def _check_param_space(space: Mapping[str, Any], path: str, errors: _Errors) -> None:
    """The root of a search space maps parameter names to nodes; it is never a primitive itself (a parameter may be
    called "choice" or "sample"), which is also how the engine reads it."""
    for key, child in space.items():
        if not isinstance(key, str):
            errors.add(path, key, "search-space keys must be strings", "use string parameter names")
            continue
        _check_space(child, f"{path}.{key}", errors)


def _check_space(node: Any, path: str, errors: _Errors) -> None:
    name = primitive_of(node)
    if name is None:
        if isinstance(node, Mapping):
            if len(node) == 1:
                (key,) = node.keys()
                close = [p for p in PRIMITIVES if p.replace("_", "") == str(key).lower().replace("_", "")]
                if close or str(key).lower() in ("normal", "lognormal", "loguniform_int", "sample"):
                    errors.add(
                        path,
                        node,
                        f"unknown search-space primitive {key!r}",
                        f"use one of {', '.join(PRIMITIVES)}"
                        + (f" (did you mean {close[0]!r}?)" if close else "")
                        + ', or {"const": {...}} for a plain nested value',
                    )
                    return
            _check_param_space(node, path, errors)
            return
        if isinstance(node, list):
            for i, child in enumerate(node):
                if primitive_of(child) is not None:
                    _check_space(child, f"{path}[{i}]", errors)
        return
    args = node[name]
    if name in ("choice", "grid_search"):
        if not isinstance(args, list) or not args:
            errors.add(path, node, f"{name} needs a non-empty list of values", f'write {{"{name}": [v1, v2, ...]}}')
        return
    if name == "sample_from":
        if not isinstance(args, str) or not IMPORT_PATH.match(args):
            errors.add(
                path,
                node,
                "sample_from takes an import path, never code",
                'write {"sample_from": "package.module:function"}; the function receives the config',
            )
        return
    if name == "const":
        return
    low_n, high_n = PRIMITIVES[name]
    if isinstance(args, Mapping):
        args = list(args.values())
    if not isinstance(args, list):
        errors.add(path, node, f"{name} takes a list of numbers", f'write {{"{name}": [{_arg_names(name)}]}}')
        return
    if not (low_n <= len(args) <= high_n):
        errors.add(path, node, f"{name} takes {_arg_names(name)}", f'write {{"{name}": [{_arg_names(name)}]}}')
        return
    if not all(_is_number(a) for a in args):
        errors.add(path, node, f"{name} takes finite numbers only", f"write [{_arg_names(name)}] as numbers")
        return
    if name in ("randn", "qrandn"):
        if len(args) >= 2 and args[1] <= 0:
            errors.add(path, node, "the standard deviation must be > 0", "give a positive sd")
        if name == "qrandn" and args[2] <= 0:
            errors.add(path, node, "q must be > 0", "give a positive quantization step")
        return
    low, high = args[0], args[1]
    if low >= high:
        errors.add(path, node, f"lower bound {low} is not below upper bound {high}", "swap or widen the bounds")
    if name in _LOG_PRIMITIVES and low <= 0:
        errors.add(path, node, f"{name} needs a lower bound > 0 (log scale)", "use a positive lower bound")
    if name in _INT_PRIMITIVES and not (_is_int(low) and _is_int(high)):
        errors.add(path, node, f"{name} needs integer bounds", "write the bounds without a decimal point")
    if name in ("quniform", "qloguniform", "qrandint", "qlograndint") and len(args) >= 3:
        q = args[2]
        if q <= 0:
            errors.add(path, node, "q must be > 0", "give a positive quantization step")
        elif name in ("qrandint", "qlograndint") and not _is_int(q):
            errors.add(path, node, "q must be an integer for integer primitives", "use an integer step")
    base_at = 3 if name in ("qloguniform", "qlograndint") else 2
    if name in _LOG_PRIMITIVES and len(args) > base_at and args[base_at] <= 1:
        errors.add(path, node, "the log base must be > 1", "use base 10 or e")


def _arg_names(name: str) -> str:
    return {
        "uniform": "low, high",
        "quniform": "low, high, q",
        "loguniform": "low, high[, base]",
        "qloguniform": "low, high, q[, base]",
        "randn": "[mean, sd]",
        "qrandn": "mean, sd, q",
        "randint": "low, high",
        "qrandint": "low, high[, q]",
        "lograndint": "low, high[, base]",
        "qlograndint": "low, high, q[, base]",
    }.get(name, "values")


def _grids(node: Any, path: str) -> list[tuple[str, Any]]:
    """Every grid_search node in a space, with its path."""
    if primitive_of(node) == "grid_search":
        return [(path, node)]
    if isinstance(node, Mapping) and primitive_of(node) is None:
        return [g for k, v in node.items() for g in _grids(v, f"{path}.{k}")]
    return []


#: Ray Tune 2.60 runs a dict whose only key is ``"eval"`` as Python, at any depth of a config, a sampled ``choice``
#: value or a point to evaluate (``ray/tune/search/variant_generator.py``, ``_try_resolve``: ``eval(v["eval"], ...)``).
#: It is the only JSON form Tune turns into a call (``grid_search`` expands to values; ``Domain`` and callables cannot
#: be written in JSON). No spec may carry it anywhere: a spec is data.
TUNE_CODE_KEYS = frozenset({"eval"})


def tune_code_nodes(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every node below ``value`` that Ray Tune would run as code (``{"eval": ...}``), with its path."""
    found: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            if len(node) == 1 and next(iter(node.keys())) in TUNE_CODE_KEYS:
                found.append((where, node))
                continue
            stack.extend((f"{where}.{k}", v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
    return sorted(found, key=lambda item: item[0])


def non_finite_numbers(value: Any, path: str) -> list[tuple[str, float]]:
    """Every NaN or infinite float below ``value``, with its path: strict JSON has no such numbers."""
    found: list[tuple[str, float]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            found.append((where, node))
        elif isinstance(node, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(node))
    return sorted(found, key=lambda item: item[0])


def _space_code_references(node: Any, path: str) -> list[tuple[str, str]]:
    """The ``sample_from`` import paths of a search-space node, where the engine resolves them (not inside const)."""
    name = primitive_of(node)
    if name == "sample_from":
        return [(path, node["sample_from"])] if isinstance(node["sample_from"], str) else []
    if name == "const":
        return []
    if name in ("choice", "grid_search"):
        values = node[name] if isinstance(node[name], list) else []
        return [ref for i, v in enumerate(values) for ref in _space_code_references(v, f"{path}.{name}[{i}]")]
    if name is not None:
        return []
    if isinstance(node, Mapping):
        return [ref for k, v in node.items() for ref in _space_code_references(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [ref for i, v in enumerate(node) for ref in _space_code_references(v, f"{path}[{i}]")]
    return []


def code_references(spec: ExperimentSpec) -> list[tuple[str, str]]:
    """Every import path of a spec, with its field: the code the cluster imports and runs for this experiment.

    ``trainable``, ``scheduler.factory``, ``search.factory`` and each ``sample_from`` in ``param_space`` or in PBT's
    ``hyperparam_mutations``. Everything else in a spec is data.
    """
    refs: list[tuple[str, str]] = [("trainable", spec.trainable)]
    if spec.scheduler.factory:
        refs.append(("scheduler.factory", spec.scheduler.factory))
    if spec.search.factory:
        refs.append(("search.factory", spec.search.factory))
    for key, node in spec.param_space.items():
        refs += _space_code_references(node, f"param_space.{key}")
    mutations = spec.scheduler.args.get("hyperparam_mutations") if isinstance(spec.scheduler.args, Mapping) else None
    if isinstance(mutations, Mapping):
        for key, node in mutations.items():
            if not isinstance(node, list):  # a list of values is data; anything else is a search-space node
                refs += _space_code_references(node, f"scheduler.args.hyperparam_mutations.{key}")
    return refs


_SCALAR_SCHEMA: dict[str, Any] = {"type": ["number", "string", "boolean", "null"]}


def search_space_schema(primitives: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A JSON schema of a flat search space: each parameter is one primitive with its exact arguments.

    For trigger forms (Airflow ``Param``): values inside ``choice``/``grid_search`` are scalars, and no other key is
    accepted anywhere, so a form cannot carry nested configs. The operator's own checks still apply to what passes.

    :param primitives: the primitives to offer; by default every number primitive plus choice and grid_search.
    """
    numbers = {"type": "array", "items": {"type": "number"}}
    offered = primitives or tuple(p for p in PRIMITIVES if p not in ("sample_from", "const"))
    options = []
    for name in offered:
        if name not in PRIMITIVES or name in ("sample_from", "const"):
            raise ValueError(f"primitive {name!r}: a form offers only {', '.join(PRIMITIVES)} minus sample_from/const")
        low, high = PRIMITIVES[name]
        if name in ("choice", "grid_search"):
            args: dict[str, Any] = {"type": "array", "minItems": 1, "items": _SCALAR_SCHEMA}
        else:
            args = {**numbers, "minItems": low, "maxItems": high}
        options.append(
            {"type": "object", "properties": {name: args}, "required": [name], "additionalProperties": False}
        )
    return {
        "type": "object",
        "minProperties": 1,
        "propertyNames": {"pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
        "additionalProperties": {"oneOf": options},
    }


# --- spec parts ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SchedulerSpec:
    """A Tune scheduler by ``name``, or a user's ``factory`` (``"pkg.mod:fn"``), with JSON ``args``."""

    name: str | None = "fifo"
    factory: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SearchSpec:
    """A search algorithm by ``name`` or a user's ``factory``, with JSON ``args`` and an optional concurrency limit."""

    name: str | None = "random"
    factory: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    max_concurrent: int | None = None


@dataclass(frozen=True, kw_only=True)
class ResourcesSpec:
    """Resources per trial: one dict (``{"cpu": 1, "gpu": 0, "memory": bytes, "<custom>": n}``) or placement
    group ``bundles`` with a ``strategy`` (the trainable runs in the first bundle, its child actors in the others)."""

    per_trial: dict[str, float] | None = None
    bundles: list[dict[str, float]] | None = None
    strategy: str = "PACK"


@dataclass(frozen=True, kw_only=True)
class CheckpointSpec:
    """How many checkpoints to keep and by what score; ``frequency``/``at_end`` are for Class API trainables."""

    num_to_keep: int | None = None
    score_attribute: str | None = None
    score_order: Literal["min", "max"] | None = None
    frequency: int = 0
    at_end: bool | None = None


@dataclass(frozen=True, kw_only=True)
class FailureSpec:
    """Retries of failed trials and whether one failed trial stops the experiment.

    ``tolerate_errored_trials``: with False, any errored trial fails the job; with True (default) the job fails only
    when no trial finished.
    """

    max_failures: int = 0
    fail_fast: bool = False
    tolerate_errored_trials: bool = True


_PARTS = {
    "scheduler": SchedulerSpec,
    "search": SearchSpec,
    "resources": ResourcesSpec,
    "checkpoint": CheckpointSpec,
    "failure": FailureSpec,
}


@dataclass(frozen=True, kw_only=True)
class ExperimentSpec:
    """A Ray Tune experiment as plain JSON. Build it with :meth:`from_dict`, which validates every field.

    :param trainable: import path of a function or ``tune.Trainable`` subclass, ``"package.module:attr"``.
    :param name: experiment name, unique in ``storage_path``; a rerun with the same name restores the experiment.
    :param storage_path: where Tune keeps state and checkpoints: ``s3://bucket/prefix``, an absolute path, or a
        pyarrow filesystem URI.
    :param metric: the metric to optimize, as the trainable reports it.
    :param mode: ``"min"`` or ``"max"``.
    :param param_space: the declarative search space (see :data:`PRIMITIVES`).
    :param errored_trials: what a rerun does with trials that errored: resume from their checkpoint, restart them
        from scratch, or keep them as errored.
    """

    trainable: str
    name: str
    storage_path: str
    metric: str
    mode: Literal["min", "max"]
    param_space: dict[str, Any] = field(default_factory=dict)
    trainable_kwargs: dict[str, Any] = field(default_factory=dict)
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    reuse_actors: bool = False
    time_budget_s: float | None = None
    stop: dict[str, float] | None = None
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    search: SearchSpec = field(default_factory=SearchSpec)
    points_to_evaluate: list[dict[str, Any]] | None = None
    resources: ResourcesSpec | None = None
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    failure: FailureSpec = field(default_factory=FailureSpec)
    errored_trials: Literal["resume", "restart", "keep"] = "resume"
    best_scope: str = "last"
    progress_interval_s: float = 10.0
    version: int = SPEC_VERSION

    # -- JSON in/out ----------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        """Validate ``data`` and build the spec; raise :class:`SpecError` listing every problem."""
        errors = _Errors()
        if not isinstance(data, Mapping):
            raise SpecError([f"spec = {_show(data)}: must be a JSON object; pass a dict of the spec's fields"])
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                close = _did_you_mean(key, sorted(known))
                errors.add(
                    str(key),
                    data[key],
                    "unknown field",
                    f"did you mean {close!r}?" if close else f"known fields: {', '.join(sorted(known))}",
                )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            if key in _PARTS and value is not None:
                part = _build_part(key, value, errors)
                if part is not None:
                    kwargs[key] = part
            elif key in _PARTS and value is None and key != "resources":
                continue
            else:
                kwargs[key] = value
        for required in ("trainable", "name", "storage_path", "metric", "mode"):
            if data.get(required) in (None, ""):
                errors.add(required, data.get(required), "is required", _REQUIRED_FIX[required])
        if errors.items:
            _validate_fields(kwargs, errors)
            raise SpecError(errors.items)
        _validate_fields(kwargs, errors)
        if errors.items:
            raise SpecError(errors.items)
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> ExperimentSpec:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError([f"spec is not valid JSON: {exc}; check quotes and commas"]) from None
        except TypeError:
            raise SpecError([f"spec = {_show(text)}: is not JSON text; pass a str (or use from_dict)"]) from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("sort_keys", True)
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    # -- derived --------------------------------------------------------------------------------------------------
    @property
    def experiment_uri(self) -> str:
        return join_uri(self.storage_path, self.name)

    def identity(self) -> dict[str, Any]:
        """What question the experiment answers: the fields two runs of one experiment name must agree on.

        A restored Tune experiment keeps its search space, trainable, scheduler and searcher whatever a rerun asks, and
        a finished one's result answers the question it was asked. Policies (resources, checkpoints, failures,
        budgets, progress) and warm-start points may change between tries.
        """
        return identity_of(self.to_dict())

    def fingerprint(self) -> str:
        return fingerprint_of(self.to_dict())


IDENTITY_FIELDS = (
    "trainable",
    "param_space",
    "trainable_kwargs",
    "metric",
    "mode",
    "num_samples",
    "stop",
    "scheduler",
    "search",
)


def identity_of(spec_dict: Mapping[str, Any]) -> dict[str, Any]:
    """:meth:`ExperimentSpec.identity` of a spec as a dict (e.g. a ``spec.json`` written by an earlier run)."""
    return {name: spec_dict.get(name) for name in IDENTITY_FIELDS}


def fingerprint_of(spec_dict: Mapping[str, Any]) -> str:
    text = json.dumps(identity_of(spec_dict), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def identity_differences(before: Mapping[str, Any], after: Mapping[str, Any], limit: int = 6) -> list[str]:
    """Where two specs (as dicts) ask different questions, each as ``path: old -> new``, down to the differing keys."""
    found: list[str] = []

    def walk(path: str, a: Any, b: Any) -> None:
        if a == b:
            return
        nodes = isinstance(a, Mapping) and isinstance(b, Mapping)
        if nodes and primitive_of(a) is None and primitive_of(b) is None:
            for key in [*a, *(k for k in b if k not in a)]:
                walk(f"{path}.{key}", a.get(key, "<unset>"), b.get(key, "<unset>"))
        else:
            found.append(f"{path}: {_show(a)} -> {_show(b)}")

    a, b = identity_of(before), identity_of(after)
    for name in IDENTITY_FIELDS:
        walk(name, a[name], b[name])
    return found[:limit] + ([f"and {len(found) - limit} more"] if len(found) > limit else [])


_REQUIRED_FIX = {
    "trainable": 'give the import path of a function or Trainable class, e.g. "my_pkg.train:train_fn"',
    "name": "give an experiment name (the Airflow operator derives one from the task instance)",
    "storage_path": 'give where checkpoints go, e.g. "s3://my-bucket/experiments"',
    "metric": 'name the metric the trainable reports, e.g. "loss"',
    "mode": 'say "min" or "max"',
}


def _build_part(key: str, value: Any, errors: _Errors) -> Any:
    cls = _PARTS[key]
    if key == "resources" and isinstance(value, list):
        value = {"bundles": value}
    elif key == "resources" and isinstance(value, Mapping) and "bundles" not in value and "per_trial" not in value:
        amounts = {k: v for k, v in value.items() if k != "strategy"}
        value = {"per_trial": amounts, **({"strategy": value["strategy"]} if "strategy" in value else {})}
    if key in ("scheduler", "search") and isinstance(value, str):
        value = {"factory": value} if ":" in value else {"name": value}
    if not isinstance(value, Mapping):
        errors.add(key, value, "must be a JSON object", f"write {key} as {{...}} with fields {_field_list(cls)}")
        return None
    known = {f.name for f in fields(cls)}
    bad = [k for k in value if k not in known]
    for k in bad:
        close = _did_you_mean(k, [f.name for f in fields(cls)])
        hint = f"did you mean {close!r}? " if close else ""
        errors.add(f"{key}.{k}", value[k], "unknown field", f"{hint}{key} takes {_field_list(cls)}")
    if bad:
        return None
    if key in ("scheduler", "search") and value.get("factory") and "name" not in value:
        value = {**value, "name": None}
    try:
        return cls(**value)
    except TypeError as exc:  # pragma: no cover - guarded by the field check above
        errors.add(key, value, str(exc), f"{key} takes {_field_list(cls)}")
        return None


def _field_list(cls: type) -> str:
    return ", ".join(f.name for f in fields(cls))


def _validate_fields(kw: dict[str, Any], errors: _Errors) -> None:
    trainable = kw.get("trainable")
    if trainable is not None and (not isinstance(trainable, str) or not IMPORT_PATH.match(trainable)):
        errors.add(
            "trainable",
            trainable,
            "not an import path",
            'write "package.module:function_or_class" (the module must be importable on the cluster)',
        )
    name = kw.get("name")
    if name not in (None, "") and (not isinstance(name, str) or not _EXPERIMENT_NAME.match(name) or ".." in name):
        errors.add(
            "name",
            name,
            "not a safe experiment name",
            "use 1-200 letters, digits and . _ = - (no slashes, spaces or '..'), starting with a letter or digit",
        )
    storage = kw.get("storage_path")
    if storage not in (None, ""):
        _check_storage(storage, errors)
    metric, mode = kw.get("metric"), kw.get("mode")
    if metric not in (None, "") and (not isinstance(metric, str) or not _METRIC_NAME.match(metric)):
        errors.add("metric", metric, "not a metric name", 'use the key the trainable reports, e.g. "loss"')
    if mode not in (None, "") and mode not in ("min", "max"):
        errors.add("mode", mode, "must be 'min' or 'max'", 'say "min" to minimize the metric, "max" to maximize it')
    space = kw.get("param_space", {})
    if not isinstance(space, Mapping):
        errors.add("param_space", space, "must be a JSON object", 'write {"lr": {"loguniform": [1e-4, 1e-1]}, ...}')
    else:
        _check_param_space(space, "param_space", errors)
    tk = kw.get("trainable_kwargs", {})
    if not isinstance(tk, Mapping):
        errors.add("trainable_kwargs", tk, "must be a JSON object", "pass keyword arguments as {name: value}")
    else:
        try:
            json.dumps(tk)
        except (TypeError, ValueError):
            errors.add("trainable_kwargs", tk, "is not JSON", "pass only JSON values (numbers, strings, lists, dicts)")
    _check_int(kw, "num_samples", errors, minimum=1, fix="give how many times to sample the space, e.g. 8")
    _check_int(kw, "max_concurrent_trials", errors, minimum=1, optional=True, fix="give a positive limit or null")
    if "reuse_actors" in kw and not isinstance(kw["reuse_actors"], bool):
        errors.add("reuse_actors", kw["reuse_actors"], "must be true or false", "write true or false")
    tb = kw.get("time_budget_s")
    if tb is not None and (not _is_number(tb) or tb <= 0):
        errors.add("time_budget_s", tb, "must be a positive number of seconds", "give e.g. 3600, or null")
    pi = kw.get("progress_interval_s", 10.0)
    if not _is_number(pi) or pi < 0.5:
        errors.add("progress_interval_s", pi, "must be a number >= 0.5", "give e.g. 10")
    stop = kw.get("stop")
    if stop is not None:
        if not isinstance(stop, Mapping) or not stop:
            errors.add("stop", stop, "must be an object of metric thresholds", 'write {"training_iteration": 10}')
        else:
            for k, v in stop.items():
                # Tune stops a trial once result[k] >= v; a boolean such as {"done": True} works the same way.
                if not (_is_number(v) or isinstance(v, bool)):
                    errors.add(
                        f"stop.{k}", v, "must be a number or true/false", "give the value at which a trial stops"
                    )
    _check_scheduler(kw, errors)
    _check_search(kw, errors)
    ptes = kw.get("points_to_evaluate")
    if ptes is not None:
        if not isinstance(ptes, list) or not all(isinstance(p, Mapping) for p in ptes):
            errors.add("points_to_evaluate", ptes, "must be a list of configs", 'write [{"lr": 0.01}, ...]')
        elif isinstance(space, Mapping):
            for i, point in enumerate(ptes):
                unknown = [k for k in point if k not in space]
                if unknown:
                    errors.add(
                        f"points_to_evaluate[{i}]",
                        point,
                        f"names parameters not in param_space: {', '.join(unknown)}",
                        "use the param_space's keys",
                    )
    _check_resources(kw.get("resources"), errors)
    _check_checkpoint(kw, errors)
    failure = kw.get("failure")
    if isinstance(failure, FailureSpec):
        if not _is_int(failure.max_failures) or failure.max_failures < -1:
            errors.add("failure.max_failures", failure.max_failures, "must be an integer >= -1", "-1 retries forever")
        for flag in ("fail_fast", "tolerate_errored_trials"):
            if not isinstance(getattr(failure, flag), bool):
                errors.add(f"failure.{flag}", getattr(failure, flag), "must be true or false", "write true or false")
    et = kw.get("errored_trials", "resume")
    if et not in ERRORED_TRIAL_POLICIES:
        errors.add("errored_trials", et, "unknown policy", f"use one of {', '.join(ERRORED_TRIAL_POLICIES)}")
    scope = kw.get("best_scope", "last")
    if scope not in BEST_SCOPES:
        errors.add("best_scope", scope, "unknown scope", f"use one of {', '.join(BEST_SCOPES)}")
    version = kw.get("version", SPEC_VERSION)
    if not _is_int(version) or version != SPEC_VERSION:
        errors.add("version", version, "unsupported spec version", f"this engine reads version {SPEC_VERSION}")
    _check_data_only(kw, errors)


def _check_data_only(kw: dict[str, Any], errors: _Errors) -> None:
    """A spec is strict JSON data: no node Tune runs as code and no NaN or infinity, in any field at any depth."""
    for key, value in kw.items():
        plain = asdict(value) if is_dataclass(value) and not isinstance(value, type) else value
        for where, node in tune_code_nodes(plain, key):
            errors.add(
                where,
                node,
                'Ray Tune runs {"eval": ...} as Python code, so a spec never carries it',
                "give a plain value, or a sample_from import path written in the DAG file",
            )
        for where, number in non_finite_numbers(plain, key):
            named = {item.split(" = ", 1)[0] for item in errors.items}
            # A field's own check may have named this number already (e.g. the bounds of a uniform).
            if any(where[: m.start()] in named for m in re.finditer(r"[.\[]|$", where)):
                continue
            errors.add(
                where,
                number,
                "not a finite number (strict JSON has no NaN or infinity)",
                "give a finite number, or null or a string that the trainable converts",
            )


def _check_int(
    kw: dict[str, Any], key: str, errors: _Errors, *, minimum: int, fix: str, optional: bool = False
) -> None:
    if key not in kw:
        return
    value = kw[key]
    if value is None and optional:
        return
    if not _is_int(value) or value < minimum:
        errors.add(key, value, f"must be an integer >= {minimum}", fix)


def _check_storage(storage: Any, errors: _Errors) -> None:
    if not isinstance(storage, str):
        errors.add("storage_path", storage, "must be a string", 'give e.g. "s3://my-bucket/experiments"')
        return
    if "://" in storage:
        scheme, rest = storage.split("://", 1)
        if scheme not in STORAGE_SCHEMES:
            errors.add(
                "storage_path",
                storage,
                f"unsupported scheme {scheme!r}",
                f"use one of {', '.join(s + '://' for s in STORAGE_SCHEMES)} or an absolute path",
            )
            return
        if scheme == "file":
            if not rest.startswith("/"):
                errors.add("storage_path", storage, "file URIs need an absolute path", "write file:///abs/path")
            return
        bucket = rest.split("/", 1)[0]
        if not bucket:
            errors.add("storage_path", storage, "has no bucket", f"write {scheme}://bucket/prefix")
        elif scheme == "s3" and not _S3_BUCKET.match(bucket):
            errors.add(
                "storage_path",
                storage,
                f"{bucket!r} is not a valid S3 bucket name",
                "use 3-63 lowercase letters, digits, dots and hyphens",
            )
        if any(part in ("..", ".") for part in rest.split("/")) or " " in rest:
            errors.add("storage_path", storage, "has '.', '..' or spaces in the path", "use a plain key prefix")
        return
    if not storage.startswith("/"):
        errors.add(
            "storage_path",
            storage,
            "is a relative path or has no scheme",
            "use s3://bucket/prefix, or an absolute path that every Ray node shares",
        )


def _check_scheduler(kw: dict[str, Any], errors: _Errors) -> None:
    sched = kw.get("scheduler")
    if not isinstance(sched, SchedulerSpec):
        return
    if not isinstance(sched.args, Mapping):
        errors.add("scheduler.args", sched.args, "must be a JSON object", "pass keyword arguments as {name: value}")
        return
    if sched.factory is not None:
        if not isinstance(sched.factory, str) or not IMPORT_PATH.match(sched.factory):
            errors.add("scheduler.factory", sched.factory, "not an import path", 'write "package.module:function"')
        return
    name = SCHEDULER_ALIASES.get(str(sched.name).lower(), str(sched.name).lower())
    if name not in SCHEDULERS:
        errors.add(
            "scheduler.name",
            sched.name,
            "unknown scheduler",
            f"use one of {', '.join(SCHEDULERS)}, or a factory import path",
        )
        return
    for arg in sched.args:
        if arg in ("metric", "mode"):
            errors.add(f"scheduler.args.{arg}", sched.args[arg], "is set by the spec", f"set the spec's {arg} instead")
        elif arg not in SCHEDULERS[name]:
            allowed = ", ".join(sorted(SCHEDULERS[name])) or "no arguments"
            errors.add(
                f"scheduler.args.{arg}", sched.args[arg], f"not an argument of {name}", f"{name} takes {allowed}"
            )
    for arg in ("max_t", "grace_period", "reduction_factor", "perturbation_interval", "brackets"):
        if arg in sched.args and (not _is_number(sched.args[arg]) or sched.args[arg] <= 0):
            errors.add(f"scheduler.args.{arg}", sched.args[arg], "must be a positive number", "give e.g. 1")
    if name == "asha" and {"grace_period", "max_t"} <= set(sched.args):
        if _is_number(sched.args["grace_period"]) and _is_number(sched.args["max_t"]):
            if sched.args["grace_period"] > sched.args["max_t"]:
                errors.add(
                    "scheduler.args.grace_period",
                    sched.args["grace_period"],
                    f"exceeds max_t {sched.args['max_t']}",
                    "make grace_period <= max_t",
                )
    if name == "pbt":
        mutations = sched.args.get("hyperparam_mutations")
        if not isinstance(mutations, Mapping) or not mutations:
            errors.add(
                "scheduler.args.hyperparam_mutations",
                mutations,
                "PBT needs mutations",
                'write {"lr": {"loguniform": [1e-4, 1e-1]}} or {"lr": [0.1, 0.01]}',
            )
        else:
            for k, v in mutations.items():
                if not isinstance(v, list):
                    _check_space(v, f"scheduler.args.hyperparam_mutations.{k}", errors)
    if name == "pb2":
        bounds = sched.args.get("hyperparam_bounds")
        if not isinstance(bounds, Mapping) or not bounds:
            errors.add("scheduler.args.hyperparam_bounds", bounds, "PB2 needs bounds", 'write {"lr": [0.0001, 0.1]}')
        else:
            for k, v in bounds.items():
                if not (isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v) and v[0] < v[1]):
                    errors.add(
                        f"scheduler.args.hyperparam_bounds.{k}",
                        v,
                        "must be [low, high] with low < high",
                        "fix the bounds",
                    )


def _check_search(kw: dict[str, Any], errors: _Errors) -> None:
    search = kw.get("search")
    if not isinstance(search, SearchSpec):
        return
    if not isinstance(search.args, Mapping):
        errors.add("search.args", search.args, "must be a JSON object", "pass keyword arguments as {name: value}")
        return
    if search.max_concurrent is not None and (not _is_int(search.max_concurrent) or search.max_concurrent < 1):
        errors.add("search.max_concurrent", search.max_concurrent, "must be an integer >= 1", "give e.g. 2, or null")
    if search.factory is not None:
        if not isinstance(search.factory, str) or not IMPORT_PATH.match(search.factory):
            errors.add("search.factory", search.factory, "not an import path", 'write "package.module:function"')
        return
    name = str(search.name).lower()
    if name not in SEARCHERS:
        errors.add("search.name", search.name, "unknown search algorithm", f"use one of {', '.join(SEARCHERS)}")
        return
    for arg, field_name in (
        ("metric", "metric"),
        ("mode", "mode"),
        ("space", "param_space"),
        ("points_to_evaluate", "points_to_evaluate"),
    ):
        if arg in search.args:
            why = (
                "a searcher's own space is not JSON (Optuna distributions, hyperopt hp objects); the spec's "
                "param_space is converted for every searcher"
                if arg == "space"
                else "is set by the spec"
            )
            errors.add(f"search.args.{arg}", search.args[arg], why, f"set the spec's {field_name} instead")
    space = kw.get("param_space", {})
    if name not in ("random", "grid") and isinstance(space, Mapping):
        for path, node in _grids(space, "param_space"):
            errors.add(
                path,
                node,
                f"the {name} searcher cannot sample grid_search",
                'use "choice", or the random/grid searcher',
            )


def _check_resources(res: Any, errors: _Errors) -> None:
    if not isinstance(res, ResourcesSpec):
        return
    if res.per_trial is not None and res.bundles is not None:
        errors.add("resources", asdict(res), "give per_trial or bundles, not both", "drop one of them")
    if res.per_trial is not None:
        if not isinstance(res.per_trial, Mapping) or not res.per_trial:
            errors.add("resources", res.per_trial, "must be a non-empty object", 'write {"cpu": 1, "gpu": 0}')
        else:
            _check_bundle(res.per_trial, "resources", errors)
    if res.bundles is not None:
        if not isinstance(res.bundles, list) or not res.bundles:
            errors.add("resources.bundles", res.bundles, "must be a non-empty list", 'write [{"CPU": 1}, {"CPU": 1}]')
        else:
            for i, bundle in enumerate(res.bundles):
                if not isinstance(bundle, Mapping) or not bundle:
                    errors.add(f"resources.bundles[{i}]", bundle, "must be a non-empty object", 'write {"CPU": 1}')
                else:
                    _check_bundle(bundle, f"resources.bundles[{i}]", errors)
    if res.strategy not in PLACEMENT_STRATEGIES:
        errors.add(
            "resources.strategy", res.strategy, "unknown strategy", f"use one of {', '.join(PLACEMENT_STRATEGIES)}"
        )


def _check_bundle(bundle: Mapping[str, Any], path: str, errors: _Errors) -> None:
    for key, value in bundle.items():
        if not _is_number(value) or value < 0:
            errors.add(f"{path}.{key}", value, "must be a number >= 0", "give an amount, e.g. 1 or 0.5")
    if all(_is_number(v) and v == 0 for v in bundle.values()):
        errors.add(path, dict(bundle), "asks for no resources at all", 'ask for at least {"cpu": 1}')


def _check_checkpoint(kw: dict[str, Any], errors: _Errors) -> None:
    ckpt = kw.get("checkpoint")
    if not isinstance(ckpt, CheckpointSpec):
        return
    if ckpt.num_to_keep is not None and (not _is_int(ckpt.num_to_keep) or ckpt.num_to_keep < 1):
        errors.add(
            "checkpoint.num_to_keep", ckpt.num_to_keep, "must be an integer >= 1", "give e.g. 2, or null for all"
        )
    if not _is_int(ckpt.frequency) or ckpt.frequency < 0:
        errors.add(
            "checkpoint.frequency", ckpt.frequency, "must be an integer >= 0", "0 turns periodic checkpoints off"
        )
    if ckpt.at_end is not None and not isinstance(ckpt.at_end, bool):
        errors.add("checkpoint.at_end", ckpt.at_end, "must be true, false or null", "write true or false")
    if ckpt.score_order is not None and ckpt.score_order not in ("min", "max"):
        errors.add("checkpoint.score_order", ckpt.score_order, "must be 'min' or 'max'", 'say "min" or "max"')
    if ckpt.score_attribute is not None and (not isinstance(ckpt.score_attribute, str) or not ckpt.score_attribute):
        errors.add("checkpoint.score_attribute", ckpt.score_attribute, "must be a metric name", 'e.g. "loss"')


# --- names and URIs -----------------------------------------------------------------------------------------------
def experiment_name_for(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """A deterministic, S3-safe, readable experiment name for one task instance (the same for every try).

    Built from the run id, never from a logical date (manual and API runs have none). A short hash of the raw
    identity keeps two names apart when sanitizing makes them look alike.
    """
    raw = json.dumps([dag_id, task_id, run_id, map_index])
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]

    def clean(text: str, limit: int) -> str:
        # Each part starts and ends with a letter or digit: the name must start with one ("_dag" is a valid dag id).
        text = re.sub(r"[^A-Za-z0-9._=-]+", "-", str(text)).strip("-._=")
        text = re.sub(r"\.{2,}", ".", text)
        return text[:limit].strip("-._=") or "x"

    parts = [clean(dag_id, 60), clean(task_id, 60)]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index)[:12])
    parts.append(clean(run_id, 50))
    return "__".join(parts) + f"-{digest}"
