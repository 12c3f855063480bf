"""What the Experiment view shows, shaped for the page from the experiment's reduced files: bounded, whatever the
experiment's size or its files' content.

The Airflow side (:mod:`airflow_tune.plugins.experiment_app`) says which task instance it is about in a
:class:`TaskFacts`; :mod:`airflow_tune.plugins.experiment_files` reads the files; this module builds the view's JSON:

- the header: name, status, counts by trial state, the best trial (metric, config), the best checkpoint, the Ray job
  link and the promotion decision;
- the trial table: at most :data:`TABLE_ROWS` rows (the best by the metric and mode, the running ones, the errored
  ones with their error), at most :data:`CONFIG_COLUMNS` config columns, every text cut to a known length;
- the curves: at most :data:`MAX_CURVES` trials of at most :data:`MAX_POINTS` points each, the best marked.

**Ownership.** The user was authorized for the DAG of the task instance (``facts.dag_id``), but the experiment's URI
comes from data (an XCom, a rendered ``experiment_name``) and may name another DAG's experiment. So an experiment is
shown only when every file that proves an owner says it is this DAG's: ``progress.json`` and ``result.json`` must
each record an owner (the engine writes one) with this ``dag_id``; one that records another owner or none refuses
the whole experiment with one sentence naming the experiment and its owner, and no value of its files. The same DAG's
other tasks are its readers: a different task, map index or run of the same DAG is shown, with a note. ``history.json``
is refused the same way when it names another owner; one without an owner is shown only beside a progress or result
file that proved the owner (without them the page shows no curves anyway).

So the response's size does not grow with the number of trials, iterations, or the length of anything in the files;
whatever they hold, it stays under :data:`~airflow_tune.plugins.experiment_bounds.MAX_RESPONSE_BYTES` (see
:func:`~airflow_tune.plugins.experiment_bounds.fit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_tune.common import jsonsafe
from airflow_tune.common.contract import HISTORY_FILE, PROGRESS_FILE, RESULT_FILE, describe_owner, owner_differs
from airflow_tune.plugins.experiment_bounds import (
    CONFIG_COLUMNS,
    ERROR_CHARS,
    ID_CHARS,
    MAX_CURVES,
    MAX_POINTS,
    NAME_CHARS,
    TABLE_ROWS,
    TEXT_CHARS,
    URI_CHARS,
    cut,
    fit,
    flat_config,
    leaf,
    number,
    safe_link,
    tracking_links,
)
from airflow_tune.plugins.experiment_files import ExperimentFiles, load_files, rank_key, row, select_rows

REFRESH_S = 5
LIVE_TASK_STATES = frozenset(
    {"running", "deferred", "queued", "scheduled", "up_for_retry", "up_for_reschedule", "restarting"}
)
NOT_STARTED_STATES = frozenset({None, "none", "", "scheduled", "queued", "removed", "skipped", "upstream_failed"})


@dataclass
class TaskFacts:
    """What Airflow knows about one task instance, as the view needs it (filled by the plugin from the database)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1
    found: bool = True
    state: str | None = None
    operator: str | None = None
    is_tune: bool = False
    experiment_uri: str | None = None
    #: Where the URI came from: "xcom" (the task's result), "rendered" (its rendered fields) or "dag" (its arguments).
    experiment_source: str | None = None
    ray_job_url: str | None = None
    #: The decision of a PromoteCheckpointOperator of the same run about this experiment: its XCom result.
    promotion: dict[str, Any] | None = None
    #: The deployment's MLflow server, every link's base: ``{"conn_id", "tracking_uri", "ui_url"}`` or None.
    mlflow_server: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return (self.state or "none") in LIVE_TASK_STATES


def cell(value: Any) -> str:
    """A config value in a table cell: floats to 6 significant digits, the rest as JSON text, cut."""
    if isinstance(value, float) and number(value) is not None:
        return f"{value:.6g}"
    return cut(value, TEXT_CHARS)


def experiment_name(facts: TaskFacts) -> str:
    """The experiment's name as the task's own data gives it (the last segment of its URI)."""
    return cut((facts.experiment_uri or "").rstrip("/").rsplit("/", 1)[-1], NAME_CHARS)


# -- ownership -------------------------------------------------------------------------------------------------------
def refusal(facts: TaskFacts, files: ExperimentFiles) -> str | None:
    """Why the experiment's files may not be shown on a page of ``facts.dag_id``, or None (see the module's
    docstring). Drops an ownerless ``history.json`` when no other file proved the owner."""
    readers = {"dag_id": facts.dag_id}
    unowned: str | None = None
    proved = False
    for name, data in ((PROGRESS_FILE, files.progress), (RESULT_FILE, files.result), (HISTORY_FILE, files.history)):
        if data is None:
            continue
        owner = data.get("owner")
        if owner is None:
            unowned = unowned or (name if name != HISTORY_FILE else None)
        elif owner_differs(owner, readers, same_dag_only=True):
            return (
                f"Experiment {experiment_name(facts)} belongs to {describe_owner(owner)}, not to DAG "
                f"{cut(facts.dag_id, NAME_CHARS)!r}: it is not shown here."
            )
        else:
            proved = proved or name != HISTORY_FILE
    if unowned:
        return (
            f"Experiment {experiment_name(facts)} is not shown: its {unowned} records no owner, so it cannot be told "
            "whose experiment it is (it was not written by this version of airflow-tune; running the task again "
            "writes its files with their owner)."
        )
    if files.history is not None and files.history.get("owner") is None and not proved:
        files.history = None
    return None


def owner_note(facts: TaskFacts, owner: Mapping[str, Any]) -> str | None:
    """A sentence when this DAG's experiment was written by another of its tasks, map indexes or runs."""
    mine = {"dag_id": facts.dag_id, "task_id": facts.task_id, "map_index": facts.map_index, "run_id": facts.run_id}
    if not owner_differs(owner, mine):
        return None
    run = f", run {cut(owner['run_id'], NAME_CHARS)!r}" if owner.get("run_id") else ""
    return f"This experiment was written by {describe_owner(owner)}{run} of this DAG, not by this task instance."


# -- rows and curves -------------------------------------------------------------------------------------------------
def progress_rows(progress: Mapping[str, Any] | None, history: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Rows of a running experiment: its top and running trials (progress.json), then the trials only the history
    lists (their last point)."""
    rows = {r["trial_id"]: dict(r) for r in (progress or {}).get("rows", [])}
    for trial_id, entry in ((history or {}).get("trials") or {}).items():
        if trial_id not in rows:
            last = entry["last"]
            rows[trial_id] = row(trial_id, entry["status"], last[0], last[1], entry["config"])
    return list(rows.values())


def curves_of(
    history: Mapping[str, Any] | None, mode: str, best_id: str | None, statuses: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """At most :data:`MAX_CURVES` curves of at most :data:`MAX_POINTS` points: the best trials, then running ones.

    :param statuses: trial statuses newer than the history's (progress.json and result.json are rewritten when a trial
        ends; the history only at its own pace).
    """
    statuses = statuses or {}
    curves: list[dict[str, Any]] = []
    for trial_id, entry in ((history or {}).get("trials") or {}).items():
        points = entry["points"]
        if not points:
            continue
        last = next((y for _, y in reversed(points) if y is not None), None)
        status = statuses.get(trial_id) or entry["status"]
        curves.append({"trial_id": trial_id, "status": status, "value": last, "points": points})
    key = rank_key(mode)
    best = sorted(curves, key=key)
    running = [c for c in best if c["status"] == "RUNNING"]
    shown = best[: MAX_CURVES // 2]
    shown += [c for c in running if c not in shown][: MAX_CURVES - len(shown)]
    shown += [c for c in best if c not in shown][: MAX_CURVES - len(shown)]
    shown.sort(key=key)
    for c in shown:
        c["best"] = c["trial_id"] == best_id
    return shown


# -- the view --------------------------------------------------------------------------------------------------------
def _config_columns(rows: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Config keys as columns, those that differ between rows first; at most :data:`CONFIG_COLUMNS`."""
    seen: dict[str, set[str]] = {}
    for r in rows:
        for key, value in r["flat"].items():
            seen.setdefault(key, set()).add(jsonsafe.dumps(value, sort_keys=True))
    keys = sorted(seen, key=lambda k: (len(seen[k]) <= 1, k))
    return keys[:CONFIG_COLUMNS], max(0, len(keys) - CONFIG_COLUMNS)


def _table(rows: list[dict[str, Any]], total: int, best_id: str | None) -> dict[str, Any]:
    for r in rows:
        r["flat"] = flat_config(r.pop("config"))
    columns, hidden = _config_columns(rows)
    shown_rows = []
    for r in rows:
        flat = r.pop("flat")
        r["config"] = {k: cell(flat[k]) for k in columns if k in flat}
        r["best"] = r["trial_id"] == best_id
        shown_rows.append(r)
    note = None
    if total > len(shown_rows):
        kinds = "the best by the metric, the running ones and the errored ones"
        note = f"Showing {len(shown_rows)} of {total} trials: {kinds}."
    return {
        "columns": columns,
        "hidden_columns": hidden,
        "rows": shown_rows,
        "total": total,
        "shown": len(shown_rows),
        "note": note,
    }


def message_view(facts: TaskFacts, state: str, message: str, *, refresh: bool = False) -> dict[str, Any]:
    return {
        "state": state,
        "message": message,
        "task": _task(facts),
        "refresh_s": REFRESH_S if refresh else None,
    }


def _task(facts: TaskFacts) -> dict[str, Any]:
    return {
        "dag_id": cut(facts.dag_id, NAME_CHARS),
        "run_id": cut(facts.run_id, NAME_CHARS),
        "task_id": cut(facts.task_id, NAME_CHARS),
        "map_index": facts.map_index,
        "state": cut(facts.state, ID_CHARS) if facts.state else None,
        "operator": cut(facts.operator, NAME_CHARS) if facts.operator else None,
    }


def build_view(facts: TaskFacts, files: ExperimentFiles | None = None) -> dict[str, Any]:
    """The view's JSON for one task instance: a plain sentence when there is nothing to show, else the experiment.

    :param facts: the task instance, as Airflow knows it.
    :param files: the experiment's files (read with :func:`~airflow_tune.plugins.experiment_files.load_files` when
        not given).
    """
    task = cut(facts.task_id, NAME_CHARS)
    if not facts.found:
        where = f"run {cut(facts.run_id, NAME_CHARS)} of DAG {cut(facts.dag_id, NAME_CHARS)}"
        return message_view(facts, "not_found", f"There is no task {task} in {where}.")
    if not facts.is_tune:
        operator = cut(facts.operator, NAME_CHARS) if facts.operator else None
        kind = f"a {operator} task, not a RayTuneOperator task" if operator else "not a RayTuneOperator task"
        return message_view(facts, "not_tune", f"Task {task} is {kind}: it has no experiment to show.")
    state = cut(facts.state, ID_CHARS) if facts.state else None
    if not facts.experiment_uri:
        if facts.live or facts.state in NOT_STARTED_STATES:
            return message_view(
                facts,
                "no_experiment",
                f"Task {task} has not started an experiment yet (task state: {state or 'none'}).",
                refresh=True,
            )
        return message_view(
            facts,
            "no_experiment",
            f"Task {task} ended ({state}) leaving no record of an experiment: it returned no result, "
            "its rendered fields are gone and its arguments are templates.",
        )
    if len(facts.experiment_uri) > URI_CHARS:
        return message_view(
            facts,
            "no_experiment",
            f"The experiment URI task {task} records is {len(facts.experiment_uri)} characters long, over the view's "
            f"limit of {URI_CHARS}: it is not read.",
        )
    if files is None:
        files = load_files(facts.experiment_uri)
    refused = refusal(facts, files)
    if refused:
        view = message_view(facts, "refused", refused)
        view.update({"experiment": experiment_name(facts), "experiment_uri": facts.experiment_uri})
        return view
    return fit(experiment_view(facts, files))


def experiment_view(facts: TaskFacts, files: ExperimentFiles) -> dict[str, Any]:
    assert facts.experiment_uri is not None
    progress, result, history = files.progress, files.result, files.history
    name, task, state = experiment_name(facts), cut(facts.task_id, NAME_CHARS), cut(facts.state or "none", ID_CHARS)
    if progress is None and result is None:
        if facts.live:
            view = message_view(
                facts,
                "starting",
                f"Experiment {name} has started; its first progress appears here within a few seconds.",
                refresh=True,
            )
        elif facts.state in NOT_STARTED_STATES:
            view = message_view(
                facts,
                "no_experiment",
                f"Task {task} has not started an experiment yet (task state: {state}).",
                refresh=True,
            )
        else:
            view = message_view(
                facts, "no_experiment", f"Task {task} ended ({state}) before experiment {name} wrote any progress."
            )
        view.update({"experiment": name, "experiment_uri": facts.experiment_uri, "problems": files.problems})
        return view

    # The result is the final word, unless a newer run of the same experiment (a retry) is writing progress.
    rerun = bool(
        result
        and progress
        and progress["updated_at"] is not None
        and result["finished_at"] is not None
        and progress["updated_at"] > result["finished_at"]
    )
    use_result = result is not None and (not rerun or not facts.live)
    source: dict[str, Any] = (result if use_result else progress) or {}
    metric = source["metric"] or (history or {}).get("metric") or ""
    mode = source["mode"]
    if use_result:
        assert result is not None
        status = result["status"]
        counts, num_trials, best = result["counts"], result["num_trials"], result["best"]
        rows, total = [dict(r) for r in result["rows"]], result["rows_total"]
        checkpoint = result["best_checkpoint_uri"]
        updated_at = result["finished_at"]
    else:
        assert progress is not None
        status = "running" if facts.live else ("failed" if facts.state == "failed" else "stopped")
        counts, num_trials, best = progress["counts"], progress["num_trials"], progress["best"]
        rows = select_rows(progress_rows(progress, history), mode)
        total = num_trials if num_trials is not None else len(rows)
        checkpoint = None
        updated_at = progress["updated_at"]
    best_id = best["trial_id"] if best else None
    tracking = tracking_links(source.get("mlflow"), facts.mlflow_server)
    for r in rows:
        r["mlflow_url"] = (tracking or {}).get("runs", {}).get(r["trial_id"])
    curves = curves_of(history, mode, best_id, {r["trial_id"]: r["status"] for r in rows})
    history_note = None
    if history is None:
        history_note = "No metric history for this experiment yet (history.json is written while it runs)."
    owner = source["owner"]
    problems = list(files.problems)
    if owner_note(facts, owner):
        problems.insert(0, str(owner_note(facts, owner)))
    if source.get("mlflow") and not tracking:
        conn = (facts.mlflow_server or {}).get("conn_id", "mlflow_default")
        problems.append(
            f"No MLflow links: they are built only on the connection {conn!r}'s server, for an experiment tracked "
            "there, with MLflow's own ids."
        )
    view = {
        "state": "experiment",
        "message": None,
        "task": _task(facts),
        "experiment": (result or {}).get("experiment") or (progress or {}).get("experiment") or name,
        "experiment_uri": facts.experiment_uri,
        "owner": {k: cut(v, NAME_CHARS) if isinstance(v, str) else v for k, v in owner.items()},
        "status": status,
        "metric": cut(metric, NAME_CHARS),
        "mode": mode,
        "num_trials": num_trials,
        "counts": counts,
        "best": best,
        "best_checkpoint_uri": checkpoint,
        **{k: source.get(k) for k in ("objectives", "pareto_front", "pareto_front_size")},  # several objectives
        "ray_job_url": safe_link(facts.ray_job_url),
        "mlflow": tracking and {k: v for k, v in tracking.items() if k != "runs"},
        "promotion": _promotion(facts.promotion),
        "table": _table(rows, total, best_id),
        "curves": curves,
        "history_note": history_note,
        "updated_at": updated_at,
        "problems": problems,
        "refresh_s": REFRESH_S if facts.live and status not in ("succeeded",) else None,
        "limits": {
            "table_rows": TABLE_ROWS,
            "config_columns": CONFIG_COLUMNS,
            "curves": MAX_CURVES,
            "points_per_curve": MAX_POINTS,
        },
    }
    return jsonsafe.strict(view)  # type: ignore[no-any-return]


def _promotion(decision: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not decision:
        return None
    uri = decision.get("uri")
    return {
        "task_id": cut(decision.get("task_id"), NAME_CHARS) if decision.get("task_id") is not None else None,
        "promoted": bool(decision.get("promoted")),
        "version": leaf(decision.get("version")),
        "reason": cut(decision.get("reason") or "", ERROR_CHARS),
        "uri": cut(uri, URI_CHARS) if isinstance(uri, str) else None,
    }
