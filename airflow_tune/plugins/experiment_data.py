"""What the Experiment view shows, from the experiment's own files in storage: bounded, whatever the experiment's size.

Pure logic plus storage reads; imports neither airflow nor ray, so it is tested on files alone. The Airflow side
(:mod:`airflow_tune.plugins.experiment_app`) says which task instance it is about in a :class:`TaskFacts`; this module
reads ``progress.json``, ``result.json`` and ``history.json`` beside the experiment and builds the view's JSON:

- the header: name, status, counts by trial state, the best trial (metric, config), the best checkpoint, the Ray job
  link and the promotion decision;
- the trial table: at most :data:`TABLE_ROWS` rows (the best by the metric and mode, the running ones, the errored
  ones with their error), at most :data:`CONFIG_COLUMNS` config columns, every text cut to a known length;
- the curves: at most :data:`MAX_CURVES` trials of at most :data:`MAX_POINTS` points each, the best marked.

So the response's size does not grow with the number of trials or iterations. ``progress.json`` and ``history.json``
are bounded by the engine; ``result.json`` may list every trial, so it is reduced once per version and the reduction
is cached (one metadata request per view then). Files larger than :data:`MAX_FILE_BYTES` are not read.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_tune import jsonsafe
from airflow_tune.contract import HISTORY_FILE, PROGRESS_FILE, RESULT_FILE, manifest_uri, result_succeeded

TABLE_ROWS = 100
RUNNING_ROWS = 20
ERRORED_ROWS = 20
CONFIG_COLUMNS = 12
TEXT_CHARS = 80
ERROR_CHARS = 400
CONFIG_TEXT_CHARS = 600
MAX_CURVES = 20
MAX_POINTS = 200
MAX_FILE_BYTES = 64 * 1024 * 1024
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
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return (self.state or "none") in LIVE_TASK_STATES


# -- small helpers --------------------------------------------------------------------------------------------------
def number(value: Any) -> float | None:
    """A finite metric value, or None (missing, not a number, NaN, infinite or their strict-JSON strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def shown_value(value: Any) -> float | str | None:
    """A metric as the view shows it: a finite number, or the text of a non-finite one ("NaN")."""
    if isinstance(value, float) and not math.isfinite(value):
        return jsonsafe.encode_float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    if value in (jsonsafe.NAN, jsonsafe.POS_INF, jsonsafe.NEG_INF):
        return str(value)
    return None


def cut(text: Any, limit: int) -> str:
    text = text if isinstance(text, str) else jsonsafe.dumps(text, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell(value: Any) -> str:
    """A config value in a table cell: floats to 6 significant digits, the rest as JSON text, cut."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.6g}"
    return cut(value, TEXT_CHARS)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves."""
    if not isinstance(config, Mapping):
        return {prefix or "config": config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def safe_link(url: Any) -> str | None:
    """Only http(s) links reach the page (a ``javascript:`` URL in an XCom must not become a link)."""
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return url
    return None


def rank_key(mode: str) -> Callable[[dict[str, Any]], tuple[int, float, str]]:
    """Best first by the mode; rows without a finite value last; then by trial id."""

    def key(row: dict[str, Any]) -> tuple[int, float, str]:
        value = number(row.get("value"))
        if value is None:
            return (1, 0.0, str(row.get("trial_id")))
        return (0, value if mode == "min" else -value, str(row.get("trial_id")))

    return key


# -- reading the files ---------------------------------------------------------------------------------------------
class FileTooLarge(Exception):
    pass


class ResultCache:
    """Reduced ``result.json`` by URI, size and modification time: a finished experiment's file is parsed once."""

    def __init__(self, maxsize: int = 32) -> None:
        self.maxsize = maxsize
        self._entries: OrderedDict[str, tuple[tuple[int, Any], dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self.parses = 0

    def get(self, uri: str, reduce: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
        stamp, raw = read_file(uri, only_if_not=self._stamp(uri))
        if stamp is None:
            return None
        if raw is None:  # unchanged
            with self._lock:
                return self._entries[uri][1]
        reduced = reduce(raw)
        self.parses += 1
        with self._lock:
            self._entries[uri] = (stamp, reduced)
            self._entries.move_to_end(uri)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return reduced

    def _stamp(self, uri: str) -> tuple[int, Any] | None:
        with self._lock:
            entry = self._entries.get(uri)
            return entry[0] if entry else None


def read_file(uri: str, only_if_not: tuple[int, Any] | None = None) -> tuple[tuple[int, Any] | None, Any]:
    """``(stamp, parsed JSON)`` of a file; ``(None, None)`` when it does not exist; ``(stamp, None)`` when its stamp
    (size, modification time) equals ``only_if_not``. Refuses files over :data:`MAX_FILE_BYTES`."""
    import pyarrow.fs

    from airflow_tune import storage

    fs, path = storage.resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return None, None
    stamp = (int(info.size or 0), info.mtime_ns)
    if only_if_not is not None and stamp == only_if_not:
        return stamp, None
    if stamp[0] > MAX_FILE_BYTES:
        raise FileTooLarge(f"{uri} is {stamp[0] / 1e6:.0f} MB, over the view's limit of {MAX_FILE_BYTES / 1e6:.0f} MB")
    with fs.open_input_stream(path) as stream:
        return stamp, json.loads(stream.read())


_RESULTS = ResultCache()


@dataclass
class ExperimentFiles:
    progress: dict[str, Any] | None = None
    result: dict[str, Any] | None = None  # reduced, see reduce_result
    history: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def load_files(experiment_uri: str, cache: ResultCache | None = None) -> ExperimentFiles:
    """Read the experiment's three files; a file that cannot be read is named in ``problems`` (no secrets: the
    exception's type and first line only)."""
    files = ExperimentFiles()
    cache = cache or _RESULTS

    def attempt(name: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            files.problems.append(f"could not read {manifest_uri(experiment_uri, name)}: {type(exc).__name__}: {first}")
            return None

    progress = attempt(PROGRESS_FILE, lambda: read_file(manifest_uri(experiment_uri, PROGRESS_FILE))[1])
    files.progress = progress if isinstance(progress, dict) else None
    files.result = attempt(RESULT_FILE, lambda: cache.get(manifest_uri(experiment_uri, RESULT_FILE), reduce_result))
    history = attempt(HISTORY_FILE, lambda: read_file(manifest_uri(experiment_uri, HISTORY_FILE))[1])
    files.history = history if isinstance(history, dict) else None
    return files


# -- rows ----------------------------------------------------------------------------------------------------------
def _row(trial_id: Any, status: Any, iteration: Any, value: Any, config: Any, error: Any = None) -> dict[str, Any]:
    return {
        "trial_id": str(trial_id),
        "status": str(status or "UNKNOWN"),
        "iteration": iteration if isinstance(iteration, (int, float)) and not isinstance(iteration, bool) else None,
        "value": shown_value(value),
        "config": config if isinstance(config, Mapping) else {},
        "error": cut(error, ERROR_CHARS) if error else None,
    }


def select_rows(rows: Iterable[dict[str, Any]], mode: str, limit: int = TABLE_ROWS) -> list[dict[str, Any]]:
    """At most ``limit`` rows, sorted best first: the running and errored ones (up to their own limits) and the best."""
    ordered = sorted(rows, key=rank_key(mode))
    running = [r for r in ordered if r["status"] == "RUNNING"][:RUNNING_ROWS]
    errored = [r for r in ordered if r["status"] == "ERROR"][:ERRORED_ROWS]
    chosen = {r["trial_id"] for r in running + errored}
    room = max(0, limit - len(chosen))
    for row in ordered:
        if room <= 0:
            break
        if row["trial_id"] not in chosen:
            chosen.add(row["trial_id"])
            room -= 1
    return [r for r in ordered if r["trial_id"] in chosen][:limit]


def reduce_result(raw: Any) -> dict[str, Any]:
    """The bounded part of ``result.json`` the view needs. Copes with a manifest listing every trial and with one
    listing only the top trials beside counts."""
    if not isinstance(raw, dict):
        return {}
    metric, mode = str(raw.get("metric") or ""), str(raw.get("mode") or "max")
    trials = raw.get("trials") if isinstance(raw.get("trials"), list) else raw.get("top")
    trials = [t for t in (trials or []) if isinstance(t, dict)]
    rows = []
    for t in trials:
        metrics = t.get("metrics") if isinstance(t.get("metrics"), dict) else {}
        value = metrics.get(metric, t.get("value"))
        iteration = metrics.get("training_iteration", t.get("iteration"))
        error = t.get("error_summary") or t.get("error")
        rows.append(_row(t.get("trial_id"), t.get("status"), iteration, value, t.get("config"), error))
    num_trials = raw.get("num_trials") if isinstance(raw.get("num_trials"), int) else len(trials)
    counts = raw.get("counts") if isinstance(raw.get("counts"), dict) else None
    if counts is None:
        if len(trials) == num_trials:
            counts = dict(Counter(r["status"] for r in rows))
        else:
            counts = {"TERMINATED": raw.get("num_terminated") or 0, "ERROR": raw.get("num_errored") or 0}
    best_metrics: dict[str, Any] = raw["best_metrics"] if isinstance(raw.get("best_metrics"), dict) else {}
    best = None
    if raw.get("best_trial_id"):
        best = {
            "trial_id": str(raw["best_trial_id"]),
            "value": shown_value(best_metrics.get(metric)),
            "iteration": best_metrics.get("training_iteration"),
            "config": raw.get("best_config"),
        }
    return {
        "experiment": raw.get("experiment"),
        "metric": metric,
        "mode": mode,
        "status": "succeeded" if result_succeeded(raw) else "failed",
        "finished_at": raw.get("finished_at"),
        "job_id": raw.get("job_id"),
        "num_trials": num_trials,
        "counts": {str(k): v for k, v in counts.items() if v},
        "best": best,
        "best_checkpoint_uri": raw.get("best_checkpoint_uri"),
        "rows": select_rows(rows, mode),
        "rows_total": len(rows),
    }


def progress_rows(progress: Mapping[str, Any] | None, history: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Rows of a running experiment: its top and running trials (progress.json), then the trials only the history
    lists (their last point)."""
    rows: dict[str, dict[str, Any]] = {}
    for key in ("top", "running"):
        for t in (progress or {}).get(key) or []:
            if isinstance(t, dict) and t.get("trial_id") is not None:
                row = _row(t["trial_id"], t.get("status"), t.get("iteration"), t.get("value"), t.get("config"))
                rows.setdefault(row["trial_id"], row)
    for trial_id, entry in ((history or {}).get("trials") or {}).items():
        if str(trial_id) in rows or not isinstance(entry, dict):
            continue
        points = [p for p in entry.get("points") or [] if isinstance(p, list) and len(p) == 2]
        last = points[-1] if points else [None, None]
        rows[str(trial_id)] = _row(trial_id, entry.get("status"), last[0], last[1], entry.get("config"))
    return list(rows.values())


# -- curves ----------------------------------------------------------------------------------------------------------
def downsample(points: list[list[Any]], limit: int = MAX_POINTS) -> list[list[Any]]:
    """At most ``limit`` points, evenly spaced, the first and last kept (for files written with other limits)."""
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def curves_of(
    history: Mapping[str, Any] | None, mode: str, best_id: str | None, statuses: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """At most :data:`MAX_CURVES` curves of at most :data:`MAX_POINTS` points: the best trials, then running ones.

    :param statuses: trial statuses newer than the history's (progress.json and result.json are rewritten when a trial
        ends; the history only at its own pace).
    """
    statuses = statuses or {}
    entries = (history or {}).get("trials")
    if not isinstance(entries, Mapping):
        return []
    curves: list[dict[str, Any]] = []
    for trial_id, entry in entries.items():
        if not isinstance(entry, dict):
            continue
        points = []
        for p in entry.get("points") or []:
            if isinstance(p, list) and len(p) == 2 and number(p[0]) is not None:
                points.append([p[0], number(p[1])])  # a non-finite value is a gap
        if not points:
            continue
        last = next((y for _, y in reversed(points) if y is not None), None)
        status = statuses.get(str(trial_id)) or str(entry.get("status") or "")
        curves.append({"trial_id": str(trial_id), "status": status, "value": last, "points": points})
    key = rank_key(mode)
    best = sorted(curves, key=key)
    running = [c for c in best if c["status"] == "RUNNING"]
    shown = best[: MAX_CURVES // 2]
    shown += [c for c in running if c not in shown][: MAX_CURVES - len(shown)]
    shown += [c for c in best if c not in shown][: MAX_CURVES - len(shown)]
    shown.sort(key=key)
    for c in shown:
        c["points"] = downsample(c["points"])
        c["best"] = c["trial_id"] == best_id
    return shown


# -- the view --------------------------------------------------------------------------------------------------------
def _config_columns(rows: list[dict[str, Any]]) -> tuple[list[str], int]:
    """Config keys as columns, those that differ between rows first; at most :data:`CONFIG_COLUMNS`."""
    seen: dict[str, set[str]] = {}
    for row in rows:
        for key, value in row["flat"].items():
            seen.setdefault(key, set()).add(jsonsafe.dumps(value, sort_keys=True))
    keys = sorted(seen, key=lambda k: (len(seen[k]) <= 1, k))
    return keys[:CONFIG_COLUMNS], max(0, len(keys) - CONFIG_COLUMNS)


def _table(rows: list[dict[str, Any]], total: int, best_id: str | None) -> dict[str, Any]:
    for row in rows:
        row["flat"] = flatten(row.pop("config"))
    columns, hidden = _config_columns(rows)
    shown_rows = []
    for row in rows:
        flat = row.pop("flat")
        row["config"] = {k: cell(flat[k]) for k in columns if k in flat}
        row["best"] = row["trial_id"] == best_id
        shown_rows.append(row)
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
        "dag_id": facts.dag_id,
        "run_id": facts.run_id,
        "task_id": facts.task_id,
        "map_index": facts.map_index,
        "state": facts.state,
        "operator": facts.operator,
    }


def build_view(facts: TaskFacts, files: ExperimentFiles | None = None) -> dict[str, Any]:
    """The view's JSON for one task instance: a plain sentence when there is nothing to show, else the experiment.

    :param facts: the task instance, as Airflow knows it.
    :param files: the experiment's files (read with :func:`load_files` when not given).
    """
    if not facts.found:
        return message_view(
            facts, "not_found", f"There is no task {facts.task_id} in run {facts.run_id} of DAG {facts.dag_id}."
        )
    if not facts.is_tune:
        kind = (
            f"a {facts.operator} task, not a RayTuneOperator task" if facts.operator else "not a RayTuneOperator task"
        )
        return message_view(facts, "not_tune", f"Task {facts.task_id} is {kind}: it has no experiment to show.")
    if not facts.experiment_uri:
        if facts.live or facts.state in NOT_STARTED_STATES:
            return message_view(
                facts,
                "no_experiment",
                f"Task {facts.task_id} has not started an experiment yet (task state: {facts.state or 'none'}).",
                refresh=True,
            )
        return message_view(
            facts,
            "no_experiment",
            f"Task {facts.task_id} ended ({facts.state}) leaving no record of an experiment: it returned no result, "
            "its rendered fields are gone and its arguments are templates.",
        )
    if files is None:
        files = load_files(facts.experiment_uri)
    return experiment_view(facts, files)


def experiment_view(facts: TaskFacts, files: ExperimentFiles) -> dict[str, Any]:
    assert facts.experiment_uri is not None
    progress, result, history = files.progress, files.result, files.history
    name = facts.experiment_uri.rstrip("/").rsplit("/", 1)[-1]
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
                f"Task {facts.task_id} has not started an experiment yet (task state: {facts.state or 'none'}).",
                refresh=True,
            )
        else:
            view = message_view(
                facts,
                "no_experiment",
                f"Task {facts.task_id} ended ({facts.state}) before experiment {name} wrote any progress.",
            )
        view.update({"experiment": name, "experiment_uri": facts.experiment_uri, "problems": files.problems})
        return view

    # The result is the final word, unless a newer run of the same experiment (a retry) is writing progress.
    rerun = bool(
        result
        and progress
        and number(progress.get("updated_at")) is not None
        and number(result.get("finished_at")) is not None
        and progress["updated_at"] > result["finished_at"]
    )
    use_result = result is not None and (not rerun or not facts.live)
    source: dict[str, Any] = (result if use_result else progress) or {}
    metric = str(source.get("metric") or (history or {}).get("metric") or "")
    mode = str(source.get("mode") or (history or {}).get("mode") or "max")
    if use_result:
        assert result is not None
        status = result["status"]
        counts, num_trials, best = result["counts"], result["num_trials"], result["best"]
        rows, total = [dict(r) for r in result["rows"]], result["rows_total"]
        checkpoint = result.get("best_checkpoint_uri")
        updated_at = result.get("finished_at")
    else:
        assert progress is not None
        status = "running" if facts.live else ("failed" if facts.state == "failed" else "stopped")
        counts = {str(k): v for k, v in (progress.get("counts") or {}).items() if v}
        num_trials = progress.get("num_trials")
        best = progress.get("best")
        if isinstance(best, dict):
            best = {**best, "value": shown_value(best.get("value"))}
            best.setdefault("iteration", None)
        rows = select_rows(progress_rows(progress, history), mode)
        total = num_trials if isinstance(num_trials, int) else len(rows)
        checkpoint = None
        updated_at = progress.get("updated_at")
    best_id = best.get("trial_id") if isinstance(best, dict) else None
    if isinstance(best, dict):
        best = {**best, "config": cut(best.get("config") or {}, CONFIG_TEXT_CHARS)}
    curves = curves_of(history, mode, best_id, {r["trial_id"]: r["status"] for r in rows})
    history_note = None
    if history is None:
        history_note = "No metric history for this experiment yet (history.json is written while it runs)."
    promotion = None
    if facts.promotion:
        p = facts.promotion
        promotion = {
            "task_id": p.get("task_id"),
            "promoted": bool(p.get("promoted")),
            "version": p.get("version"),
            "reason": cut(p.get("reason") or "", ERROR_CHARS),
            "uri": p.get("uri"),
        }
    view = {
        "state": "experiment",
        "message": None,
        "task": _task(facts),
        "experiment": (result or {}).get("experiment") or (progress or {}).get("experiment") or name,
        "experiment_uri": facts.experiment_uri,
        "status": status,
        "metric": metric,
        "mode": mode,
        "num_trials": num_trials,
        "counts": counts,
        "best": best,
        "best_checkpoint_uri": checkpoint,
        "ray_job_url": safe_link(facts.ray_job_url),
        "promotion": promotion,
        "table": _table(rows, total, best_id),
        "curves": curves,
        "history_note": history_note,
        "updated_at": updated_at,
        "problems": files.problems,
        "refresh_s": REFRESH_S if facts.live and status not in ("succeeded",) else None,
        "limits": {
            "table_rows": TABLE_ROWS,
            "config_columns": CONFIG_COLUMNS,
            "curves": MAX_CURVES,
            "points_per_curve": MAX_POINTS,
        },
    }
    return jsonsafe.strict(view)  # type: ignore[no-any-return]
