"""The checkpoint of a Ray Train run inside a trial, as the trial's checkpoint.

A function trainable that runs a Ray Train trainer with Tune's ``TuneReportCallback`` reports no Tune checkpoint:
Train stores its checkpoints itself (under the Train run's ``storage_path``) and the callback adds each one's path
to the metrics it forwards, as ``checkpoint_path`` (``CHECKPOINT_PATH_KEY`` of ``ray.tune.integration.ray_train``, the
same in 2.43, 2.50 and 2.60, so no Ray import is needed here). When the best trial has no
Tune checkpoint, its best Train checkpoint by the metric (as Tune's ``get_best_checkpoint`` picks among its own) is the
result's ``best_checkpoint_uri``, so it can be promoted and downloaded like any other.

Storage is not trusted: a reported path is taken only when it lies inside the experiment (``experiment_uri``, the
scheme Tune's paths lose put back), which is also all PromoteCheckpointOperator accepts; one outside is ignored with a
log line. A checkpoint Train has since deleted (its ``CheckpointConfig(num_to_keep=)``) is passed over for the next
best one that still exists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_tune.common import storage
from airflow_tune.common.contract import inside_experiment
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine.log_lines import emit

#: The metric in which TuneReportCallback reports a Train checkpoint's path (scheme-less, as Tune's paths are).
CHECKPOINT_PATH_KEY = "checkpoint_path"
#: How many reported checkpoints, best first, are looked for in storage before giving up.
MAX_LOOKUPS = 10


def _say(line: str) -> None:
    emit(line)


def ranked_paths(rows: Iterable[Mapping[str, Any]], metric: str, mode: str, key: str) -> list[str]:
    """The checkpoint paths reported in ``rows`` (a trial's results, oldest first), best by ``metric`` first; among
    equal values the newest first. Rows without a path or without a finite metric are left out."""
    scored: list[tuple[float, int, str]] = []
    sign = 1.0 if mode == "min" else -1.0
    for order, row in enumerate(rows):
        path, value = row.get(key), row.get(metric)
        if not isinstance(path, str) or not path:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        scored.append((sign * float(value), -order, path))
    seen: set[str] = set()
    ranked = []
    for _, _, path in sorted(scored):
        if path not in seen:
            seen.add(path)
            ranked.append(path)
    return ranked


def result_rows(result: Any, key: str) -> list[dict[str, Any]]:
    """A trial's reported results, oldest first: Tune's metrics history of the trial (read from storage), else only
    its last result."""
    frame = getattr(result, "metrics_dataframe", None)
    rows: list[dict[str, Any]] = []
    if frame is not None and key in getattr(frame, "columns", ()):
        rows = [dict(row) for row in frame.to_dict("records")]
    if not rows and result.metrics:
        rows = [dict(result.metrics)]
    return rows


def best_uri(
    spec: ExperimentSpec,
    result: Any,
    *,
    exists: Callable[[str], bool] = storage.exists,
    say: Callable[[str], None] = _say,
) -> str | None:
    """The URI of the best Train checkpoint ``result`` (a Tune ``Result``) reported through ``checkpoint_path``
    inside the experiment, or None when it reported none there."""
    key = CHECKPOINT_PATH_KEY
    refused = 0
    lookups = 0
    for path in ranked_paths(result_rows(result, key), spec.metric, spec.mode, key):
        uri = storage.with_scheme(spec.storage_path, path)
        if not inside_experiment(uri, spec.experiment_uri):
            refused += 1
            if refused == 1:
                say(
                    f"ignoring the reported {key} {uri[:300]!r}: it lies outside the experiment "
                    f"{spec.experiment_uri}, and only a checkpoint the experiment wrote is handed on (give the Train "
                    "run a storage_path inside the trial's folder, ray.tune.get_context().get_storage().trial_fs_path)"
                )
            continue
        if lookups >= MAX_LOOKUPS:
            break
        lookups += 1
        try:
            found = exists(uri)
        except Exception as exc:  # the manifest must still be written; the checkpoint is then unknown
            say(f"could not look for the Train checkpoint {uri}: {exc}")
            return None
        if found:
            return uri
    return None
