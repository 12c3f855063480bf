"""Seed points for the searchers that take a point only whole: missing sampled keys filled by sampling the space.

Optuna, HyperOpt and BayesOpt (and most searchers a factory may return) take each point of ``points_to_evaluate``
as a complete assignment of their parameters: Optuna refuses a point that lacks one ("Dim of point ... do not
match"), HyperOpt fails on it ("GarbageCollected switch argument"), BayesOpt registers it with the optimizer, which
needs every key. A point lacks keys whenever the space grew after a champion was promoted, and a point written for
a nested space uses the space's shape, which not every searcher reads. So each missing key is drawn from its
domain, as the random searcher does itself, and logged; and each point is handed over in the searcher's shape,
the same in Ray 2.43 and 2.60 (read from both):

- Optuna and BayesOpt name nested parameters ``"net/width"`` (``flatten_dict(space, "/")``) and look points up by
  those names: flat points;
- HyperOpt flattens a point itself after reading it back (``spec_from_misc``, then ``flatten_dict``): nested points;
- a factory's searcher is unknown here: nested points, the spec's own shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_tune.common.spec.points import flatten, missing_paths, node_at, with_value
from airflow_tune.engine.log_lines import emit

#: How each searcher takes a nested point (see the module docstring); None: left as the spec gives it.
SHAPES: dict[str, str | None] = {
    "optuna": "flat",
    "bayesopt": "flat",
    "hyperopt": "nested",
    "factory": "nested",
    "random": None,
    "grid": None,
}


def seed_points(
    points: list[dict[str, Any]] | None,
    space: Mapping[str, Any],
    searcher: str,
    build_domain: Callable[[Any], Any],
    say: Callable[[str], None] | None = None,
) -> list[dict[str, Any]] | None:
    """``points`` completed and shaped for ``searcher`` (a name of :data:`SHAPES`); each filled key logged.

    :param space: the spec's declarative ``param_space``.
    :param build_domain: turns one declarative node into its Tune domain (the engine's ``build_domain``).
    """
    if not points:
        return None
    shape = SHAPES.get(searcher, "nested")
    if shape is None:
        return [dict(p) for p in points]
    say = say or _say
    out = []
    for i, point in enumerate(points):
        filled: dict[str, Any] = dict(point)
        for path in missing_paths(point, space):
            value = plain(build_domain(node_at(space, path)).sample())
            filled = with_value(filled, path, value)
            say(
                f"points_to_evaluate[{i}] has no {'.'.join(path)}: sampled {value!r} from its domain "
                f"(the {searcher} searcher takes a point only whole)"
            )
        out.append(flatten(filled, space) if shape == "flat" else filled)
    return out


def plain(value: Any) -> Any:
    """A sampled value as a plain Python value (numpy scalars have ``item()``), so it logs and pickles as itself."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _say(line: str) -> None:
    emit(line)
