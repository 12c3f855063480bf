"""How the Airflow side follows a running experiment: the engine's bounded ``progress.json``, turned into task-log
lines, printed only when they change.

The trigger and the blocking wait both use it. Reading one small file (a HEAD while nothing changed) costs the same
whatever the length of the job's log, and it costs the Ray dashboard nothing: the dashboard serves one shared status
poll per cluster, S3 serves these reads. Imports neither ray nor boto3.
"""

from __future__ import annotations

import json
import math
from typing import Any

from airflow_tune.common.contract import LOG_MARK, PROGRESS_FILE, manifest_uri

#: Trials listed under the counts line: the best, then the running ones not among them.
ROWS = 8


def progress_lines(snapshot: dict[str, Any]) -> list[str]:
    """The task-log lines of one ``progress.json`` snapshot: counts and the best, then a short trial table."""
    metric = str(snapshot.get("metric") or "metric")
    counts = " ".join(f"{k}={v}" for k, v in sorted((snapshot.get("counts") or {}).items()))
    best = snapshot.get("best") or {}
    value = best.get("value")
    best_text = f" best {metric}={value:.6g} ({best.get('trial_id')})" if _is_number(value) else ""
    lines = [f"{LOG_MARK}{snapshot.get('num_trials', 0)} trials: {counts}{best_text}"]
    lines += mlflow_lines(snapshot.get("mlflow"))
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in [*(snapshot.get("top") or []), *(snapshot.get("running") or [])]:
        if row.get("trial_id") not in seen and len(rows) < ROWS:
            seen.add(str(row.get("trial_id")))
            rows.append(row)
    if rows:
        lines.append(f"{LOG_MARK}  {'trial':<20} {'status':<11} {'iter':>5} {metric:>12}  config")
    for row in rows:
        shown = f"{row['value']:.6g}" if _is_number(row.get("value")) else "-"
        config = json.dumps(row.get("config"), sort_keys=True)
        config = config if len(config) <= 70 else config[:67] + "..."
        iteration = "" if row.get("iteration") is None else row["iteration"]
        lines.append(
            f"{LOG_MARK}  {row.get('trial_id')!s:<20} {row.get('status')!s:<11} {iteration!s:>5} {shown:>12}  {config}"
        )
    return lines


def mlflow_lines(tracking: Any) -> list[str]:
    """The task-log line about MLflow tracking's failures, when calls failed (the experiment goes on: see
    :mod:`airflow_tune.engine.mlflow_tracking`)."""
    if not isinstance(tracking, dict) or not isinstance(tracking.get("errors"), int) or tracking["errors"] <= 0:
        return []
    last = str(tracking.get("last_error") or "")[:300]
    return [
        f"{LOG_MARK}WARNING MLflow tracking: {tracking['errors']} call(s) to {str(tracking.get('tracking_uri'))[:200]} "
        f"failed, the last: {last}; the experiment goes on, its MLflow runs may miss what those calls carried"
    ]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class ProgressFollower:
    """Reads an experiment's ``progress.json`` when it changes and says which lines to print.

    :param experiment_uri: the experiment's URI.
    """

    def __init__(self, experiment_uri: str) -> None:
        self.uri = manifest_uri(experiment_uri, PROGRESS_FILE)
        self._version: Any = None
        self._printed: list[str] = []

    def poll(self) -> list[str]:
        """New lines to print (all of the current table when it changed), or [] when nothing changed. Blocking I/O:
        the trigger runs it in a thread."""
        from airflow_tune.common import storage

        snapshot, self._version = storage.read_json_if_changed(self.uri, self._version)
        if snapshot is None:
            return []
        lines = progress_lines(snapshot)
        if lines == self._printed:
            return []
        self._printed = lines
        return lines
