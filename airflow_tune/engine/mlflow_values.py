"""What MLflow takes from a trial: its config as params and its results as metrics, within MLflow's limits
(:mod:`~airflow_tune.engine.mlflow_tracking` logs them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: MLflow's limits (``mlflow.utils.validation``).
MAX_KEY = 250
MAX_PARAM_VALUE = 6000
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000
#: Result keys that are Tune's bookkeeping, not measurements.
_NOT_METRICS = frozenset({"pid", "timestamp", "date", "hostname", "node_ip", "node_id", "trial_id", "experiment_tag"})
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. /")


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``a/b`` keys (as Tune's MLflow logger writes them)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            out.update(flatten(item, f"{name}/"))
        else:
            out[name] = item
    return out


def valid_key(key: str) -> bool:
    return 0 < len(key) <= MAX_KEY and set(key) <= _KEY_CHARS and ".." not in key and not key.startswith("/")


def params_of(config: Mapping[str, Any]) -> dict[str, str]:
    """A trial's config as MLflow params: flattened, keys MLflow takes, values cut to MLflow's length."""
    return {k: str(v)[:MAX_PARAM_VALUE] for k, v in flatten(config).items() if valid_key(k)}


def metrics_of(result: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number a trial reported (nested ones flattened), without Tune's bookkeeping."""
    out: dict[str, float] = {}
    for key, value in flatten({k: v for k, v in result.items() if k != "config"}).items():
        if key in _NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value) and valid_key(key):
            out[key] = float(value)
    return out


def quoted(value: str) -> str:
    """``value`` as a string literal of MLflow's search filter."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
