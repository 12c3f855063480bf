"""Several objectives on the cluster (see :mod:`airflow_tune.common.spec.objectives`): the searcher carries them, as
Tune users write it (``OptunaSearch(metric=[...], mode=[...])``, ``TuneConfig`` without a metric), and the result
adds the Pareto front of the trials' last results to the best trial by the first objective.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from airflow_tune.common import jsonsafe
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.common.spec.objectives import objectives_of
from airflow_tune.engine.imports import EngineError

#: At most this many Pareto-optimal trials are listed in result.json and the XCom (``pareto_front_size`` counts them
#: all; every row of trials.json says whether its trial is on the front).
PARETO_LISTED = 10


def searcher_objectives(spec: ExperimentSpec) -> dict[str, Any]:
    """What a named searcher is built with for several objectives (``metric`` and ``mode`` lists), else nothing."""
    if not spec.objectives:
        return {}
    return {"metric": [o["metric"] for o in spec.objectives], "mode": [o["mode"] for o in spec.objectives]}


def check_searcher_objectives(searcher: Any, spec: ExperimentSpec, what: str) -> None:
    """A factory's searcher must carry the spec's objectives when there are several (``TuneConfig`` takes one metric,
    so Tune never gives a searcher lists), and must not carry several when the spec names one: Tune would silently
    replace them with the spec's one metric (``OptunaSearch.set_search_properties``)."""
    from ray.tune.search import ConcurrencyLimiter, Repeater

    inner = searcher
    while isinstance(inner, (ConcurrencyLimiter, Repeater)):
        inner = inner.searcher
    own_metric, own_mode = getattr(inner, "metric", None), getattr(inner, "mode", None)
    wanted = searcher_objectives(spec)
    kind = type(inner).__name__
    if wanted and (list(own_metric or []) != wanted["metric"] or list(own_mode or []) != wanted["mode"]):
        raise EngineError(
            f"{what} built a {kind} for metric {own_metric!r}, mode {own_mode!r}, but the spec has "
            f"{len(wanted['metric'])} objectives, metric {wanted['metric']!r}, mode {wanted['mode']!r}: Tune's "
            "TuneConfig takes one metric, so the searcher must carry them itself: build OptunaSearch(metric=[...], "
            "mode=[...]) with the spec's lists"
        )
    if not wanted and isinstance(own_metric, (list, tuple)) and len(own_metric) > 1:
        raise EngineError(
            f"{what} built a {kind} for {len(own_metric)} objectives, metric {list(own_metric)!r}, mode "
            f"{own_mode!r}, but the spec names one metric, {spec.metric!r}, which Tune would give it instead: give "
            "the spec the same metric and mode lists"
        )


def _score(value: Any, mode: str) -> float | None:
    """A value to minimize, or None when it cannot be compared (missing, not a number, NaN)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or math.isnan(value):
        return None
    return float(value) if mode == "min" else -float(value)


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether scores ``a`` are no worse than ``b`` in every objective and better in one (all minimized)."""
    pairs = list(zip(a, b, strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def pareto_front(metrics: Sequence[dict[str, Any]], objectives: Sequence[dict[str, str]]) -> list[int]:
    """The indexes of the Pareto-optimal results among ``metrics`` (each a trial's last result), best first by the
    first objective, then the next. A result missing an objective, or holding a non-number or NaN there, is left out;
    equal results are all kept."""
    scored: list[tuple[int, list[float]]] = []
    for i, result in enumerate(metrics):
        scores = [_score((result or {}).get(o["metric"]), o["mode"]) for o in objectives]
        if all(s is not None for s in scores):
            scored.append((i, [s for s in scores if s is not None]))
    front = [(i, s) for i, s in scored if not any(dominates(other, s) for _, other in scored)]
    return [i for i, s in sorted(front, key=lambda item: (item[1], item[0]))]


def pareto_summary(spec: ExperimentSpec, results: Sequence[Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The result manifest's ``objectives``, ``pareto_front`` and ``pareto_front_size``, from the trials' last results
    (``results``, Tune's, errored ones included) and their manifest ``rows`` (marked ``"pareto": true/false``).

    Errored trials are left out, as Optuna records them as failed. With one objective, no front (null).
    """
    objectives = objectives_of(spec)
    if len(objectives) < 2:
        return {"objectives": objectives, "pareto_front": None, "pareto_front_size": None}
    finished = [i for i, row in enumerate(rows) if row["error"] is None]
    front = [finished[i] for i in pareto_front([results[i].metrics or {} for i in finished], objectives)]
    on_front = set(front)
    for i, row in enumerate(rows):
        row["pareto"] = i in on_front
    listed = [
        {
            "trial_id": rows[i]["trial_id"],
            "config": rows[i]["config"],
            "metrics": {o["metric"]: _plain(results[i].metrics[o["metric"]]) for o in objectives},
        }
        for i in front[:PARETO_LISTED]
    ]
    return {"objectives": objectives, "pareto_front": listed, "pareto_front_size": len(front)}


def _plain(value: numbers.Real) -> Any:
    """A number as strict JSON holds it (numpy's too; an infinity as the string "Infinity")."""
    return int(value) if isinstance(value, numbers.Integral) else jsonsafe.encode_float(float(value))
