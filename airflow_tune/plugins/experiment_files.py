"""The Experiment view's reading side: an experiment's files in storage, each reduced to a small, typed form whatever
the file holds.

The view reads ``progress.json``, ``result.json`` and ``history.json`` beside the experiment
(:func:`airflow_tune.common.contract.manifest_uri`). Storage is written by us but read here as hostile input:

- a file over its size bound (:data:`~airflow_tune.plugins.experiment_bounds.MAX_FILE_BYTES`) is not fetched: one
  metadata request says how large it is, and the page names the file as a problem;
- a file is fetched and parsed only when its stamp (size and modification time) changed: its reduced form is cached
  by stamp (:class:`StampCache`), so a page refreshing every 5 s costs one metadata request per file (an S3 stamp
  has 1 s resolution: a rewrite within the same second at the same size shows at the file's next write);
- a file that is not JSON, not an object, or holds a field of the wrong type becomes a problem sentence, never an
  exception; every value is held to :mod:`airflow_tune.plugins.experiment_bounds` (strings cut, configs flat and
  capped, counts typed and capped), and rows and curves are capped;
- the owner each file records is kept as it is (``owner``), for the page to decide whose experiment it is
  (:mod:`airflow_tune.plugins.experiment_shape`).

Imports neither airflow nor ray (pyarrow only inside :func:`read_file`), so it is tested on files alone.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from airflow_tune.common.contract import HISTORY_FILE, PROGRESS_FILE, RESULT_FILE, manifest_uri
from airflow_tune.plugins.experiment_bounds import (
    CONFIG_TEXT_CHARS,
    ERROR_CHARS,
    ERRORED_ROWS,
    HISTORY_TRIALS,
    MAX_FILE_BYTES,
    MAX_POINTS,
    MIB,
    NAME_CHARS,
    RUNNING_ROWS,
    TABLE_ROWS,
    TEXT_CHARS,
    URI_CHARS,
    count,
    counts_of,
    cut,
    flat_config,
    ident,
    kind,
    note,
    number,
    owner_of,
    scalar_number,
    shown_value,
)
from airflow_tune.plugins.experiment_objectives import reduce_objectives

log = logging.getLogger(__name__)


# -- rows ----------------------------------------------------------------------------------------------------------
def rank_key(mode: str) -> Callable[[Mapping[str, Any]], tuple[int, float, str]]:
    """Best first by the mode; rows without a finite value last; then by trial id."""

    def key(row: Mapping[str, Any]) -> tuple[int, float, str]:
        value = number(row.get("value"))
        if value is None:
            return (1, 0.0, str(row.get("trial_id")))
        return (0, value if mode == "min" else -value, str(row.get("trial_id")))

    return key


def row(trial_id: Any, status: Any, iteration: Any, value: Any, config: Any, error: Any = None) -> dict[str, Any]:
    """One trial of the table (its config as found: :func:`flat_config` bounds it when the row is shown)."""
    return {
        "trial_id": ident(trial_id),
        "status": ident(status or "UNKNOWN"),
        "iteration": scalar_number(iteration),
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
    for r in ordered:
        if room <= 0:
            break
        if r["trial_id"] not in chosen:
            chosen.add(r["trial_id"])
            room -= 1
    return [r for r in ordered if r["trial_id"] in chosen][:limit]


# -- the three files -----------------------------------------------------------------------------------------------
class BadFile(ValueError):
    """A file the view cannot use at all (not an object); the message says why."""


def _common(raw: Any, name: str) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """The fields every file has: owner, experiment, metric and mode (``min`` or ``max``)."""
    if not isinstance(raw, Mapping):
        raise BadFile(f"{name} is {kind(raw)}, not a JSON object: not shown")
    metric = raw.get("metric")
    return raw, {
        "owner": owner_of(raw),
        "experiment": cut(raw["experiment"], NAME_CHARS) if isinstance(raw.get("experiment"), str) else None,
        "metric": metric if isinstance(metric, str) and len(metric) <= NAME_CHARS else "",
        "mode": "min" if raw.get("mode") == "min" else "max",
        "problems": [],
    }


def _items(doc: Mapping[str, Any], key: str, name: str, problems: list[str], shape: type = list) -> Any:
    """``doc[key]`` when it is a list (or a ``shape``), else empty; a value of another type is a problem."""
    value = doc.get(key)
    if isinstance(value, shape):
        return value
    if value is not None:
        note(problems, f"{name}: {key} is {kind(value)}, not {kind(shape())}: not shown")
    return shape()


def reduce_tracking(raw: Any, name: str, problems: list[str]) -> dict[str, Any] | None:
    """A file's ``mlflow`` (MLflow tracking, see :mod:`airflow_tune.engine.mlflow_tracking`): the server it names
    (compared with the deployment's, never linked), the experiment, the parent run and at most :data:`TABLE_ROWS`
    trial runs, each id bounded; None when tracking was off. Links are built on the deployment's MLflow server from
    the ids alone (:func:`~airflow_tune.plugins.experiment_bounds.tracking_links`)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        note(problems, f"{name}: mlflow is {kind(raw)}, not an object: not shown")
        return None
    server = raw.get("tracking_uri")
    runs: Mapping[Any, Any] = raw["runs"] if isinstance(raw.get("runs"), Mapping) else {}
    return {
        "tracking_uri": cut(server, URI_CHARS) if isinstance(server, str) else None,
        "experiment_id": ident(raw["experiment_id"]) if raw.get("experiment_id") is not None else None,
        "parent_run_id": ident(raw["parent_run_id"]) if raw.get("parent_run_id") is not None else None,
        "runs": {ident(t): ident(r) for t, r in islice(runs.items(), TABLE_ROWS) if r is not None},
        "errors": count(raw.get("errors")) or 0,
        "last_error": cut(raw["last_error"], ERROR_CHARS) if isinstance(raw.get("last_error"), str) else None,
    }


def reduce_progress(raw: Any) -> dict[str, Any]:
    """``progress.json``: counts, the best trial and the top and running trials' rows."""
    doc, out = _common(raw, PROGRESS_FILE)
    problems = out["problems"]
    rows: dict[str, dict[str, Any]] = {}
    for key in ("top", "running"):
        for t in islice(_items(doc, key, PROGRESS_FILE, problems), TABLE_ROWS):
            if isinstance(t, Mapping) and t.get("trial_id") is not None:
                r = row(t["trial_id"], t.get("status"), t.get("iteration"), t.get("value"), t.get("config"))
                rows.setdefault(r["trial_id"], {**r, "config": flat_config(r["config"])})
    best = doc.get("best")
    if isinstance(best, Mapping) and best.get("trial_id") is not None:
        best = {
            "trial_id": ident(best["trial_id"]),
            "value": shown_value(best.get("value")),
            "iteration": None,
            "config": cut(best.get("config") or {}, CONFIG_TEXT_CHARS),
        }
    elif best is not None:
        note(problems, f"{PROGRESS_FILE}: best is {kind(best)}, not an object with a trial_id: not shown")
        best = None
    out.update(
        **reduce_objectives(doc, PROGRESS_FILE, problems),
        mlflow=reduce_tracking(doc.get("mlflow"), PROGRESS_FILE, problems),
        updated_at=number(doc.get("updated_at")),
        num_trials=count(doc.get("num_trials")),
        counts=counts_of(doc.get("counts"), PROGRESS_FILE, problems),
        best=best,
        rows=list(rows.values()),
    )
    return out


def reduce_result(raw: Any) -> dict[str, Any]:
    """The bounded part of ``result.json`` the view needs. Copes with a manifest listing every trial and with one
    listing only the top trials beside counts."""
    doc, out = _common(raw, RESULT_FILE)
    problems, metric, mode = out["problems"], out["metric"], out["mode"]
    listed = "trials" if isinstance(doc.get("trials"), list) or "top" not in doc else "top"
    trials = _items(doc, listed, RESULT_FILE, problems)
    rows = []
    for t in trials:
        if not isinstance(t, Mapping):
            continue
        metrics = t["metrics"] if isinstance(t.get("metrics"), Mapping) else {}
        value = metrics.get(metric, t.get("value"))
        iteration = metrics.get("training_iteration", t.get("iteration"))
        rows.append(row(t.get("trial_id"), t.get("status"), iteration, value, t.get("config"), _error_of(t)))
    if len(rows) < len(trials):
        note(problems, f"{RESULT_FILE}: {len(trials) - len(rows)} of its trials are not objects: not shown")
    num_trials = count(doc.get("num_trials"))
    num_trials = len(rows) if num_trials is None else num_trials
    if doc.get("counts") is not None:
        counts = counts_of(doc.get("counts"), RESULT_FILE, problems)
    elif len(rows) == num_trials:
        counts = counts_of(dict(Counter(r["status"] for r in rows)), RESULT_FILE, problems)
    else:
        terminated, errored = count(doc.get("num_terminated")) or 0, count(doc.get("num_errored")) or 0
        counts = {k: v for k, v in (("TERMINATED", terminated), ("ERROR", errored)) if v}
    best_metrics = doc["best_metrics"] if isinstance(doc.get("best_metrics"), Mapping) else {}
    best = None
    if doc.get("best_trial_id"):
        best = {
            "trial_id": ident(doc["best_trial_id"]),
            "value": shown_value(best_metrics.get(metric)),
            "iteration": scalar_number(best_metrics.get("training_iteration")),
            "config": cut(doc.get("best_config") or {}, CONFIG_TEXT_CHARS),
        }
    shown = [{**r, "config": flat_config(r["config"])} for r in select_rows(rows, mode)]
    checkpoint, job_id = doc.get("best_checkpoint_uri"), doc.get("job_id")
    out.update(
        **reduce_objectives(doc, RESULT_FILE, problems),
        mlflow=reduce_tracking(doc.get("mlflow"), RESULT_FILE, problems),
        status="succeeded" if doc.get("status", "succeeded") == "succeeded" else "failed",
        finished_at=number(doc.get("finished_at")),
        job_id=cut(job_id, TEXT_CHARS) if isinstance(job_id, str) else None,
        num_trials=num_trials,
        counts=counts,
        best=best,
        best_checkpoint_uri=cut(checkpoint, URI_CHARS) if isinstance(checkpoint, str) else None,
        rows=shown,
        rows_total=len(rows),
    )
    return out


def _error_of(trial: Mapping[str, Any]) -> Any:
    return trial.get("error_summary") or trial.get("error")


def downsample(points: list[list[Any]], limit: int = MAX_POINTS) -> list[list[Any]]:
    """At most ``limit`` points, evenly spaced, the first and last kept (for files written with other limits)."""
    if len(points) <= limit:
        return points
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


def reduce_history(raw: Any) -> dict[str, Any]:
    """``history.json``: at most :data:`HISTORY_TRIALS` curves of at most :data:`MAX_POINTS` points each, with each
    trial's status, config and last reported point (for the rows of trials progress.json does not list)."""
    doc, out = _common(raw, HISTORY_FILE)
    problems = out["problems"]
    entries = _items(doc, "trials", HISTORY_FILE, problems, dict)
    if len(entries) > HISTORY_TRIALS:
        note(problems, f"{HISTORY_FILE}: {len(entries)} curves; the first {HISTORY_TRIALS} are read")
    trials: dict[str, dict[str, Any]] = {}
    for trial_id, entry in islice(entries.items(), HISTORY_TRIALS):
        if not isinstance(entry, Mapping):
            continue
        raw_points = entry["points"] if isinstance(entry.get("points"), list) else []
        pairs = [p for p in raw_points if isinstance(p, list) and len(p) == 2]
        last = pairs[-1] if pairs else [None, None]
        points = [[scalar_number(p[0]), number(p[1])] for p in pairs if number(p[0]) is not None]
        trials.setdefault(
            ident(trial_id),
            {
                "status": ident(entry.get("status") or ""),
                "config": flat_config(entry.get("config")),
                "points": downsample(points),  # a non-finite value is a gap
                "last": [scalar_number(last[0]), shown_value(last[1])],
            },
        )
    out["trials"] = trials
    return out


# -- reading, cached by stamp --------------------------------------------------------------------------------------
class FileTooLarge(Exception):
    pass


def read_file(uri: str, limit: int, only_if_not: tuple[int, Any] | None = None) -> tuple[tuple[int, Any] | None, Any]:
    """``(stamp, bytes)`` of a file; ``(None, None)`` when it does not exist; ``(stamp, None)`` when its stamp
    (size, modification time) equals ``only_if_not``. Refuses, before fetching, a file over ``limit`` bytes."""
    import pyarrow.fs

    from airflow_tune.common import storage

    fs, path = storage.resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return None, None
    stamp = (int(info.size or 0), info.mtime_ns)
    if only_if_not is not None and stamp == only_if_not:
        return stamp, None
    data = b""
    if stamp[0] <= limit:
        with fs.open_input_stream(path) as stream:
            data = stream.read(limit + 1)  # it may have grown since its stamp
    if stamp[0] > limit or len(data) > limit:
        name, size = uri.rsplit("/", 1)[-1], max(stamp[0], len(data)) / MIB
        raise FileTooLarge(f"{name} is {size:.1f} MiB or more, over the view's limit of {limit / MIB:.0f} MiB")
    return stamp, data


@dataclass(frozen=True)
class Reading:
    """A file as the view uses it: its reduced form (None when it cannot be used) and what was wrong with it."""

    data: dict[str, Any] | None
    problems: tuple[str, ...] = ()


class StampCache:
    """One kind of file reduced by ``reduce``, by URI and stamp: a file is fetched and parsed only when it changed."""

    def __init__(self, name: str, reduce: Callable[[Any], dict[str, Any]], maxsize: int = 32) -> None:
        self.name, self.reduce, self.maxsize = name, reduce, maxsize
        self.limit = MAX_FILE_BYTES[name]
        self._entries: OrderedDict[str, tuple[tuple[int, Any], Reading]] = OrderedDict()
        self._lock = threading.Lock()
        self.parses = 0

    def get(self, uri: str) -> Reading | None:
        """The file's reading; None when it does not exist. Raises what storage raises, and FileTooLarge."""
        with self._lock:
            entry = self._entries.get(uri)
        stamp, data = read_file(uri, self.limit, only_if_not=entry[0] if entry else None)
        if stamp is None:
            with self._lock:
                self._entries.pop(uri, None)
            return None
        if data is None and entry is not None:  # unchanged
            return entry[1]
        reading = self._reduce(data)
        self.parses += 1
        with self._lock:
            self._entries[uri] = (stamp, reading)
            self._entries.move_to_end(uri)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return reading

    def _reduce(self, data: bytes) -> Reading:
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            return Reading(None, (cut(f"{self.name} is not JSON ({_first_line(exc)}): not shown", ERROR_CHARS),))
        try:
            reduced = self.reduce(raw)
        except BadFile as exc:
            return Reading(None, (cut(str(exc), ERROR_CHARS),))
        except Exception as exc:  # a shape no reducer foresaw: a problem on the page, never an HTTP 500
            log.warning("the Experiment view could not reduce a %s", self.name, exc_info=True)
            return Reading(None, (cut(f"{self.name} could not be read: {type(exc).__name__}", ERROR_CHARS),))
        return Reading(reduced, tuple(reduced.pop("problems", ())))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


_PROGRESS = StampCache(PROGRESS_FILE, reduce_progress)
_RESULTS = StampCache(RESULT_FILE, reduce_result)
_HISTORY = StampCache(HISTORY_FILE, reduce_history)


@dataclass
class ExperimentFiles:
    progress: dict[str, Any] | None = None  # see reduce_progress
    result: dict[str, Any] | None = None  # see reduce_result
    history: dict[str, Any] | None = None  # see reduce_history
    problems: list[str] = field(default_factory=list)


def load_files(experiment_uri: str) -> ExperimentFiles:
    """Read the experiment's three files; a file that cannot be read or used is named in ``problems`` (no secrets:
    the exception's type and first line only)."""
    files = ExperimentFiles()
    for attr, cache in (("progress", _PROGRESS), ("result", _RESULTS), ("history", _HISTORY)):
        try:
            reading = cache.get(manifest_uri(experiment_uri, cache.name))
        except Exception as exc:
            files.problems.append(cut(f"could not read {cache.name}: {type(exc).__name__}: {_first_line(exc)}", 600))
            continue
        if reading is not None:
            setattr(files, attr, reading.data)
            files.problems.extend(reading.problems)
    return files
