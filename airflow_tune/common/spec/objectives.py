"""Several objectives: ``metric`` and ``mode`` as lists, as Tune users write them on Optuna's searcher.

``metric=["loss", "acc"], mode=["min", "max"]`` (a Python list, a rendered JSON list, or the spec file's form) is
kept as the first objective in ``metric``/``mode`` and every objective, in order, in ``objectives``: so the best trial,
its checkpoint, the progress and a promotion go by the first objective, and the result adds the Pareto front.
A single objective given as a list of one is a plain metric and mode (the same spec and fingerprint).

What Tune (2.43 to 2.60) runs with several objectives, and what is refused here:

- the searcher: only ``OptunaSearch`` takes lists (``metric``/``mode`` on the searcher, ``TuneConfig`` without
  them); the other named searchers take one metric, and a factory's searcher is checked on the cluster;
- the scheduler: FIFO only; ASHA, HyperBand, the median rule, PBT and PB2 stop or perturb trials by one metric,
  which ``TuneConfig`` no longer gives;
- Optuna's ``evaluated_rewards``: one number per point, which a study of several objectives refuses (ValueError; a
  list per point raises TypeError);
- a plateau stopper without its own ``metric`` and ``mode`` (they default to the spec's, and there is no one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_tune.common.spec.errors import Errors, show
from airflow_tune.common.spec.naming import METRIC_NAME
from airflow_tune.common.spec.stopping import stopper_name

_PLATEAU = ("trial_plateau", "experiment_plateau")
_EXAMPLE = 'metric=["loss", "accuracy"], mode=["min", "max"]'


def objectives_of(spec: Any) -> list[dict[str, str]]:
    """Every objective of a spec (or a spec dict), in order: ``[{"metric", "mode"}, ...]``, one for a single metric."""
    get = spec.get if isinstance(spec, Mapping) else lambda key: getattr(spec, key, None)
    return [dict(o) for o in get("objectives") or []] or [{"metric": get("metric"), "mode": get("mode")}]


def objectives_from_lists(data: Mapping[str, Any], errors: Errors) -> Mapping[str, Any]:
    """``data`` with ``metric``/``mode`` given as lists turned into the spec's form: the first in ``metric``/``mode``,
    all in ``objectives`` (None for one). Problems go to ``errors``, and ``data`` is returned as given."""
    metric, mode = data.get("metric"), data.get("mode")
    if not isinstance(metric, list) and not isinstance(mode, list):
        return data
    found = len(errors.items)
    if data.get("objectives") is not None:
        errors.add("objectives", data["objectives"], "given beside metric and mode as lists", "give them once")
    if not isinstance(metric, list):
        errors.add("mode", mode, "a list of modes needs a list of metrics, one each", f"write {_EXAMPLE}")
    elif not isinstance(mode, list):
        errors.add(
            "mode",
            mode,
            f"metric lists {len(metric)} objectives, so mode lists one mode for each (Optuna reads them in pairs)",
            f"write {_EXAMPLE}",
        )
    elif not metric or len(metric) != len(mode):
        errors.add("mode", mode, f"lists {len(mode)} modes for {len(metric)} metrics", f"give one each: {_EXAMPLE}")
    else:
        for i, (name, direction) in enumerate(zip(metric, mode, strict=True)):
            if not isinstance(name, str) or not METRIC_NAME.match(name):
                errors.add(f"metric[{i}]", name, "not a metric name", 'use a key the trainable reports, e.g. "loss"')
            elif name in metric[:i]:
                errors.add(f"metric[{i}]", name, "names an objective twice", "list each metric once")
            if direction not in ("min", "max"):
                errors.add(f"mode[{i}]", direction, "must be 'min' or 'max'", 'say "min" or "max" for this metric')
    if len(errors.items) > found:
        return data
    listed = [{"metric": m, "mode": o} for m, o in zip(metric, mode, strict=True)]  # type: ignore[arg-type]
    return {**data, "metric": metric[0], "mode": mode[0], "objectives": listed if len(listed) > 1 else None}  # type: ignore[index]


def check_objectives(kw: Mapping[str, Any], errors: Errors) -> None:
    """The spec's ``objectives`` (its own form, as ``spec.json`` holds it) and what Tune cannot run with them.

    ``kw`` holds the spec's fields as built (parts as objects).
    """
    objectives = kw.get("objectives")
    if objectives is None:
        return
    if not _well_formed(objectives, kw, errors):
        return
    count = f"{len(objectives)} objectives ({', '.join(o['metric'] for o in objectives)})"
    search = kw.get("search")
    if getattr(search, "factory", None) is None and str(getattr(search, "name", "random")).lower() != "optuna":
        errors.add(
            "search.name",
            getattr(search, "name", "random"),
            f"cannot search {count}: of Tune's searchers only Optuna's takes a list of metrics and modes",
            'use search="optuna" (or a factory building OptunaSearch with the same metric and mode lists), or give '
            "one metric and mode",
        )
    args = getattr(search, "args", None)
    if isinstance(args, Mapping) and args.get("evaluated_rewards"):
        errors.add(
            "search.args.evaluated_rewards",
            args["evaluated_rewards"],
            f"Optuna credits one number per point, and its study of {count} refuses it (ValueError; a list per "
            "point raises TypeError)",
            "drop evaluated_rewards (points_to_evaluate still run first), or give one metric and mode",
        )
    scheduler = kw.get("scheduler")
    name = getattr(scheduler, "canonical_name", "fifo") if getattr(scheduler, "factory", None) is None else None
    if scheduler is not None and name != "fifo":
        errors.add(
            "scheduler",
            getattr(scheduler, "factory", None) or getattr(scheduler, "name", None),
            f"a trial scheduler stops, pauses or perturbs trials by one metric, and with {count} Tune's TuneConfig "
            "has none to give it",
            'use scheduler "fifo" (the default: every trial runs to its stop), or give one metric and mode',
        )
    _check_stoppers(kw.get("stop"), count, errors)


def _well_formed(objectives: Any, kw: Mapping[str, Any], errors: Errors) -> bool:
    fix = f"write {_EXAMPLE} (the spec keeps the first in metric and mode, and every one in objectives)"
    if not isinstance(objectives, list) or len(objectives) < 2:
        errors.add("objectives", objectives, "must list two or more {metric, mode} objects", fix)
        return False
    ok = True
    for i, entry in enumerate(objectives):
        good = isinstance(entry, Mapping) and set(entry) == {"metric", "mode"}
        good = good and isinstance(entry["metric"], str) and bool(METRIC_NAME.match(entry["metric"]))
        if not good or entry["mode"] not in ("min", "max"):
            errors.add(f"objectives[{i}]", entry, 'must be {"metric": <name>, "mode": "min" or "max"}', fix)
            ok = False
    if not ok:
        return False
    names = [o["metric"] for o in objectives]
    if len(set(names)) < len(names):
        errors.add("objectives", names, "names an objective twice", "list each metric once")
        return False
    if dict(objectives[0]) != {"metric": kw.get("metric"), "mode": kw.get("mode")}:
        errors.add(
            "objectives[0]",
            objectives[0],
            f"is not the spec's metric and mode ({show(kw.get('metric'))}, {show(kw.get('mode'))}): the first "
            "objective is the one the best trial is picked by",
            fix,
        )
        return False
    return True


def _check_stoppers(stop: Any, count: str, errors: Errors) -> None:
    if not isinstance(stop, list):
        return
    for i, entry in enumerate(stop):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        name = stopper_name(entry["name"])
        args: Mapping[str, Any] = entry["args"] if isinstance(entry.get("args"), Mapping) else {}
        missing = [key for key in ("metric", "mode") if key not in args]
        if name in _PLATEAU and missing:
            errors.add(
                f"stop[{i}].args",
                dict(args),
                f"the {name} stopper's {' and '.join(missing)} default to the spec's, and with {count} there is no one",
                f'name them, e.g. {{"name": "{name}", "args": {{"metric": "loss", "mode": "min"}}}}',
            )
