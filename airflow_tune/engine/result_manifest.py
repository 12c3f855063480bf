"""The experiment's result manifests, from Tune's ResultGrid: ``trials.json`` with every trial's row, and
``result.json``, bounded (the XCom contract, counts, the top and the errored trials), which the Airflow side reads.
"""

from __future__ import annotations

import heapq
import math
import re
import time
from typing import Any

from airflow_tune.common import storage
from airflow_tune.common.contract import TRIALS_FILE, manifest_uri
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import train_checkpoints
from airflow_tune.engine.objectives import pareto_summary
from airflow_tune.engine.progress import NODE_ID, error_summary, jsonable, jsonable_metrics

#: Rows of result.json's ``trials``: the best trials by the metric, then errored ones (every row is in trials.json).
RESULT_TOP_TRIALS = 20
RESULT_ERRORED_TRIALS = 20


def build_result_manifest(spec: ExperimentSpec, result_grid: Any, *, job_id: str | None) -> dict[str, Any]:
    """The XCom contract plus a per-trial summary, from Tune's ResultGrid."""
    trials = []
    num_errored = 0
    results = list(result_grid)
    for result in results:
        errored = result.error is not None
        error = latest_failure(str(result.error)) if errored else None
        num_errored += errored
        trial_id = (result.metrics or {}).get("trial_id") or _trial_id_from_path(result.path)
        trials.append(
            {
                "trial_id": trial_id,
                "status": "ERROR" if errored else "TERMINATED",
                "config": jsonable(result.config),
                "metrics": jsonable_metrics(result.metrics, limit=20),
                "error": _short_error(error) if error is not None else None,
                "error_summary": error_summary(error) if error is not None else None,
                "path": storage.with_scheme(spec.storage_path, result.path) if result.path else None,
                NODE_ID: (result.metrics or {}).get(NODE_ID),
            }
        )
    best_trial_id = best_config = best_checkpoint_uri = None
    best_metrics: dict[str, Any] = {}
    try:
        best = result_grid.get_best_result(metric=spec.metric, mode=spec.mode, scope=spec.best_scope)
    except (RuntimeError, ValueError, KeyError):
        best = None
    if best is not None and best.metrics and spec.metric in best.metrics:
        best_trial_id = best.metrics.get("trial_id")
        best_config = jsonable(best.config)
        best_metrics = jsonable_metrics(best.metrics)
        best_checkpoint_uri = _best_checkpoint_uri(spec, best) or train_checkpoints.best_uri(spec, best)
    return {
        "experiment": spec.name,
        "experiment_uri": spec.experiment_uri,
        "owner": spec.owner,
        "fingerprint": spec.fingerprint(),
        "job_id": job_id,
        "metric": spec.metric,
        "mode": spec.mode,
        # Several objectives: best_* above go by the first (metric, mode); the front is every trial's last result.
        **pareto_summary(spec, results, trials),
        "best_trial_id": best_trial_id,
        "best_config": best_config,
        "best_metrics": best_metrics,
        "best_checkpoint_uri": best_checkpoint_uri,
        "num_trials": len(trials),
        "num_terminated": len(trials) - num_errored,
        "num_errored": num_errored,
        "trials": trials,
        "finished_at": time.time(),
    }


def bounded_result(spec: ExperimentSpec, manifest: dict[str, Any]) -> dict[str, Any]:
    """``result.json``: the manifest with only the best and the errored trials (every trial is in ``trials.json``),
    so what the Airflow side reads stays small whatever the number of trials."""
    sign = 1.0 if spec.mode == "min" else -1.0

    def score(row: dict[str, Any]) -> float:
        value = (row.get("metrics") or {}).get(spec.metric)
        return sign * value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.inf

    rows = manifest["trials"]
    best = heapq.nsmallest(RESULT_TOP_TRIALS, (r for r in rows if r["error"] is None), key=score)
    errored = [r for r in rows if r["error"] is not None][:RESULT_ERRORED_TRIALS]
    tracking = manifest.get("mlflow")
    if tracking:  # the runs of the listed trials only (each row of trials.json names its run)
        listed = {r["trial_id"] for r in (*best, *errored)}
        tracking = {**tracking, "runs": {t: r for t, r in (tracking.get("runs") or {}).items() if t in listed}}
    return {
        **manifest,
        "mlflow": tracking,
        "trials": best + errored,
        "trials_listed": len(best) + len(errored),
        "trials_uri": manifest_uri(spec.experiment_uri, TRIALS_FILE),
    }


def _best_checkpoint_uri(spec: ExperimentSpec, best: Any) -> str | None:
    checkpoint = None
    try:
        checkpoint = best.get_best_checkpoint(spec.metric, spec.mode)
    except (RuntimeError, ValueError, KeyError):
        checkpoint = None
    if checkpoint is None:
        checkpoint = best.checkpoint
    if checkpoint is None:
        return None
    return storage.with_scheme(spec.storage_path, checkpoint.path)


def _trial_id_from_path(path: str | None) -> str | None:
    if not path:
        return None
    return path.rstrip("/").rsplit("/", 1)[-1]


#: The line Tune writes into a trial's ``error.txt`` before each of its errors (``Trial.handle_error``).
_FAILURE_HEADER = re.compile(r"^Failure # \d+ \(occurred at [^)\n]*\)$", re.MULTILINE)


def latest_failure(text: str) -> str:
    """A trial's last error from Tune's error text: ``error.txt`` holds every failure of the trial, each after its
    own header line (the engine never unpickles ``error.pkl``: :func:`.compat.read_trial_errors_as_text`)."""
    headers = list(_FAILURE_HEADER.finditer(text))
    return text[headers[-1].end() :].strip("\n") if headers else text


def _short_error(text: str) -> str:
    lines = (text.strip() or "unknown error").splitlines()
    return "\n".join(lines[-8:])[:2000]
