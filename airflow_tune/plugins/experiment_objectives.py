"""Several objectives in the Experiment view: a file's ``objectives`` (the first is the one the best trial goes by)
and, in ``result.json``, the Pareto front of the trials' last results; bounded as the rest of the view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.plugins.experiment_bounds import (
    CONFIG_TEXT_CHARS,
    NAME_CHARS,
    count,
    cut,
    ident,
    kind,
    note,
    shown_value,
)

MAX_OBJECTIVES = 8
PARETO_ROWS = 20


def reduce_objectives(doc: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    """``objectives``, ``pareto_front`` (each row's ``values`` in the objectives' order) and ``pareto_front_size``;
    all null for a single objective."""
    none: dict[str, Any] = {"objectives": None, "pareto_front": None, "pareto_front_size": None}
    raw = doc.get("objectives")
    if raw is not None and not isinstance(raw, list):
        note(problems, f"{name}: objectives is {kind(raw)}, not a list: not shown")
    objectives = [
        {"metric": cut(o["metric"], NAME_CHARS), "mode": "min" if o.get("mode") == "min" else "max"}
        for o in (raw if isinstance(raw, list) else [])[:MAX_OBJECTIVES]
        if isinstance(o, Mapping) and isinstance(o.get("metric"), str)
    ]
    if len(objectives) < 2:
        return none
    front = []
    raw_front = doc.get("pareto_front")
    for t in (raw_front if isinstance(raw_front, list) else [])[:PARETO_ROWS]:
        if isinstance(t, Mapping) and t.get("trial_id") is not None:
            metrics = t["metrics"] if isinstance(t.get("metrics"), Mapping) else {}
            front.append(
                {
                    "trial_id": ident(t["trial_id"]),
                    "values": [shown_value(metrics.get(o["metric"])) for o in objectives],
                    "config": cut(t.get("config") or {}, CONFIG_TEXT_CHARS),
                }
            )
    size = count(doc.get("pareto_front_size"))
    listed = isinstance(raw_front, list)
    return {
        "objectives": objectives,
        "pareto_front": front if listed else None,
        "pareto_front_size": (size if size is not None else len(front)) if listed else None,
    }
