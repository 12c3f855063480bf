"""Seed points (``points_to_evaluate``, warm starts) against a declarative search space: which keys a searcher
samples, nested ones too; what a point lacks or names wrongly; the flat ``"a/b"`` form some searchers take.

A point is a config shaped like the space: ``{"lr": 0.01, "net": {"width": 64}}`` for
``{"lr": {"loguniform": [...]}, "net": {"width": {"randint": [...]}, "act": {"choice": [...]}}}``. Paths here are
tuples of keys through the space's plain nested objects; a primitive's value (a ``choice`` of dicts, say) is a leaf.
Imports neither airflow nor ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.space import primitive_of

Path = tuple[str, ...]

#: Primitives no searcher samples: a literal, the random searcher's grid, a function of the config.
NOT_SAMPLED = ("const", "grid_search", "sample_from")
#: Named searchers that build a model of the space and take each point whole, as the searcher's own names.
MODEL_BASED = ("optuna", "hyperopt", "bayesopt")
#: What each model-based searcher does with a point that sets a constant of the space (Ray 2.60, tried).
CONSTANT_IN_POINT = {
    "optuna": "Optuna refuses such a point on the cluster",
    "hyperopt": "HyperOpt drops the value and runs the constant",
    "bayesopt": "BayesOpt fails when it registers the trial's result",
}
#: The delimiter Tune's searchers join nested parameter names with (``flatten_dict(..., "/")``).
DELIMITER = "/"


def is_nested(node: Any) -> bool:
    """A plain nested config of the space (not a primitive)."""
    return isinstance(node, Mapping) and primitive_of(node) is None


def is_sampled(node: Any) -> bool:
    """A leaf a searcher samples: any primitive but const, grid_search and sample_from."""
    name = primitive_of(node)
    return name is not None and name not in NOT_SAMPLED


def holds_list_of_primitives(node: Any) -> bool:
    """A list value of the space with primitives in it: a searcher samples inside it, but a point cannot be
    completed there (the engine fills dict keys only)."""
    if isinstance(node, list):
        return any(primitive_of(v) is not None or holds_list_of_primitives(v) for v in node)
    if is_nested(node):
        return any(holds_list_of_primitives(v) for v in node.values())
    return False


def sampled_paths(space: Any, prefix: Path = ()) -> list[Path]:
    """Every sampled leaf of ``space``, through its nested configs, in the space's order."""
    if not isinstance(space, Mapping):
        return []
    out: list[Path] = []
    for key, node in space.items():
        path = (*prefix, str(key))
        if is_sampled(node):
            out.append(path)
        elif is_nested(node):
            out += sampled_paths(node, path)
    return out


def node_at(space: Mapping[str, Any], path: Path) -> Any:
    node: Any = space
    for key in path:
        node = node[key]
    return node


def has_path(point: Any, path: Path) -> bool:
    node = point
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return False
        node = node[key]
    return True


def missing_paths(point: Mapping[str, Any], space: Mapping[str, Any]) -> list[Path]:
    """The sampled leaves of ``space`` that ``point`` gives no value for."""
    return [path for path in sampled_paths(space) if not has_path(point, path)]


def with_value(point: Mapping[str, Any], path: Path, value: Any) -> dict[str, Any]:
    """A copy of ``point`` with ``value`` at ``path`` (nested configs copied along the way, created when absent)."""
    out = dict(point)
    head, *rest = path
    if rest:
        inner = out.get(head)
        out[head] = with_value(inner if isinstance(inner, Mapping) else {}, tuple(rest), value)
    else:
        out[head] = value
    return out


def flatten(point: Mapping[str, Any], space: Mapping[str, Any]) -> dict[str, Any]:
    """``point`` with its nested configs as ``"a/b"`` keys, where the space nests (never inside a leaf's value):
    the form OptunaSearch and BayesOptSearch name nested parameters in."""
    out: dict[str, Any] = {}
    for key, value in point.items():
        node: Any = space.get(key) if isinstance(space, Mapping) else None
        if is_nested(node) and isinstance(value, Mapping):
            for sub, inner in flatten(value, node).items():
                out[f"{key}{DELIMITER}{sub}"] = inner
        else:
            out[key] = value
    return out


def restrict(config: Any, space: Any) -> dict[str, Any]:
    """``config`` restricted to the sampled leaves of ``space`` (and its lists holding primitives), nested configs
    kept nested and dropped when nothing sampled is left in them: what a warm start takes from an earlier config."""
    if not isinstance(config, Mapping) or not isinstance(space, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, value in config.items():
        node = space.get(key)
        if is_sampled(node) or (holds_list_of_primitives(node) and not is_nested(node)):
            out[key] = value
        elif is_nested(node) and isinstance(value, Mapping):
            inner = restrict(value, node)
            if inner:
                out[key] = inner
    return out


def point_problems(point: Mapping[str, Any], space: Mapping[str, Any], searcher: str | None) -> list[tuple[str, str]]:
    """What keeps ``point`` from seeding ``space``, as (problem, fix) pairs.

    :param searcher: the named searcher (``"optuna"``, ...), ``"factory"`` for a searcher factory, None for the
        random/grid one. A model-based searcher takes a point as its own parameters: constants are not among them,
        and a key the engine cannot fill (a list of primitives) must be given.
    """
    problems: list[tuple[str, str]] = []
    unknown = _unknown(point, space, ())
    if unknown:
        problems.append((f"names parameters not in param_space: {', '.join(unknown)}", "use the param_space's keys"))
    if searcher is None:
        return problems
    if searcher in MODEL_BASED:
        constants, flat = _not_sampled(point, space, ())
        if constants:
            problems.append(
                (
                    f"gives values for {', '.join(constants)}: constants in param_space, not parameters of the "
                    f"{searcher} searcher ({CONSTANT_IN_POINT[searcher]})",
                    "drop them from the point (the trial gets the constant), or make them primitives in param_space",
                )
            )
        if flat:
            problems.append(
                (
                    f"gives plain values for {', '.join(flat)}, nested configs in param_space",
                    "give an object of their keys, nested as in param_space",
                )
            )
    unfillable = [
        ".".join((*prefix, key))
        for prefix, key, node in _walk(space, ())
        if holds_list_of_primitives(node) and not is_nested(node) and not has_path(point, (*prefix, key))
    ]
    if unfillable:
        problems.append(
            (
                f"lacks {', '.join(unfillable)}: lists holding primitives, which the engine cannot fill for "
                + ("a searcher factory" if searcher == "factory" else f"the {searcher} searcher"),
                "give their values in the point",
            )
        )
    return problems


def _walk(space: Mapping[str, Any], prefix: Path) -> list[tuple[Path, str, Any]]:
    out: list[tuple[Path, str, Any]] = []
    for key, node in space.items():
        out.append((prefix, str(key), node))
        if is_nested(node):
            out += _walk(node, (*prefix, str(key)))
    return out


def _unknown(point: Mapping[str, Any], space: Mapping[str, Any], prefix: Path) -> list[str]:
    out: list[str] = []
    for key, value in point.items():
        path = (*prefix, str(key))
        if key not in space:
            out.append(".".join(path))
        elif is_nested(space[key]) and isinstance(value, Mapping):
            out += _unknown(value, space[key], path)
    return out


def _not_sampled(point: Mapping[str, Any], space: Mapping[str, Any], prefix: Path) -> tuple[list[str], list[str]]:
    constants: list[str] = []
    flat: list[str] = []
    for key, value in point.items():
        if key not in space:
            continue
        node, path = space[key], ".".join((*prefix, str(key)))
        if is_nested(node):
            if isinstance(value, Mapping):
                more_constants, more_flat = _not_sampled(value, node, (*prefix, str(key)))
                constants += more_constants
                flat += more_flat
            elif sampled_paths(node):
                flat.append(path)
            else:
                constants.append(path)
        elif not is_sampled(node) and not holds_list_of_primitives(node):
            constants.append(path)
    return constants, flat
