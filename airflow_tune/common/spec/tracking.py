"""The spec's ``mlflow``: each trial tracked as an MLflow run, under one parent run per experiment.

``{"tracking_uri": "http://mlflow:5000", "experiment_name": "airflow-tune/dag/task", "tags": {"team": "ml"},
"ui_url": "https://mlflow.example.com"}`` or null. The operator fills ``tracking_uri`` and ``ui_url`` from its MLflow
connection; ``experiment_name`` and ``tags`` are data (a template or a conf may choose them). The engine's own
callback (:mod:`airflow_tune.engine.mlflow_tracking`) does the logging; see docs/mlflow.rst for what each run holds.

Credentials never travel in the spec (it is stored beside the experiment and shown as a rendered field): a URI with
a user or password, and a tag named like a credential, are refused. The cluster authenticates with its own
environment (``MLFLOW_TRACKING_TOKEN``, ...). Not part of the experiment's identity: tracking may be turned on or off
between tries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow_tune.common.spec.callbacks import _CREDENTIAL_NAME, logger_name, normalize_callback
from airflow_tune.common.spec.errors import Errors, did_you_mean

KEYS = ("tracking_uri", "experiment_name", "tags", "ui_url")
#: Tag keys the engine sets itself (and MLflow's own): a user tag may not overwrite them.
RESERVED_TAG_PREFIXES = ("airflow_tune.", "mlflow.")
#: MLflow's limits (``mlflow.utils.validation``): tag keys 250 characters, values 8000; experiment names are
#: stored in a 256-character column by the SQL stores.
MAX_TAG_KEY = 250
MAX_TAG_VALUE = 8000
MAX_EXPERIMENT_NAME = 256
_EXAMPLE = '{"experiment_name": "my-experiment", "tags": {"team": "ml"}}'


def check_tracking(value: Any, errors: Errors, *, where: str = "mlflow") -> dict[str, Any] | None:
    """The ``mlflow`` field in its full form (``tags`` and ``ui_url`` filled in), or None when it is null or
    invalid; every problem is added to ``errors``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        errors.add(where, value, "must be a JSON object or null", f"write {_EXAMPLE}, or null to track nothing")
        return None
    ok = True
    for key in value:
        if key not in KEYS:
            close = did_you_mean(key, KEYS)
            errors.add(
                f"{where}.{key}",
                value[key],
                "unknown key",
                f"did you mean {close!r}?" if close else f"known keys: {', '.join(KEYS)}",
            )
            ok = False
    for key in ("tracking_uri", "ui_url"):
        if value.get(key) is None and key == "ui_url":
            continue
        ok &= _check_url(f"{where}.{key}", value.get(key), errors)
    name = value.get("experiment_name")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_EXPERIMENT_NAME:
        errors.add(
            f"{where}.experiment_name",
            name,
            f"must be a non-empty string of at most {MAX_EXPERIMENT_NAME} characters",
            'give the MLflow experiment to log into, e.g. "airflow-tune/my_dag/tune" (the operator\'s default)',
        )
        ok = False
    tags = value.get("tags", {})
    if tags is None:
        tags = {}
    if not isinstance(tags, Mapping):
        errors.add(f"{where}.tags", tags, "must be a JSON object of strings", 'write {"team": "ml"}')
        ok = False
    else:
        ok &= _check_tags(tags, f"{where}.tags", errors)
    if not ok:
        return None
    return {
        "tracking_uri": str(value["tracking_uri"]).rstrip("/"),
        "experiment_name": name,
        "tags": dict(tags),
        "ui_url": str(value["ui_url"]).rstrip("/") if value.get("ui_url") is not None else None,
    }


def _check_url(where: str, url: Any, errors: Errors) -> bool:
    if not isinstance(url, str) or not url.strip():
        errors.add(where, url, "must be an http(s) URL", "set the tracking server on the MLflow connection's host")
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        errors.add(where, url, "is not a URL", "give the server's URL, e.g. http://mlflow:5000")
        return False
    if parts.username or parts.password:
        errors.add(
            where,
            "<a URL with credentials>",
            "carries credentials into the spec, which is stored beside the experiment",
            "drop them from the URL: the cluster authenticates with its own environment (MLFLOW_TRACKING_TOKEN, or "
            "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD on its nodes)",
        )
        return False
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        # A path or database URI would be a store MLflow writes on the driver's node.
        errors.add(where, url, "is not an http(s) URL of a tracking server", "give e.g. http://mlflow:5000")
        return False
    if parts.query or parts.fragment:
        errors.add(
            where,
            "<a URL with a query or fragment>",
            "a server URL has no query or fragment (and a query may carry a token)",
            "give the server's base URL, e.g. http://mlflow:5000",
        )
        return False
    return True


def _check_tags(tags: Mapping[Any, Any], where: str, errors: Errors) -> bool:
    ok = True
    for key, tag in tags.items():
        at = f"{where}.{key}"
        if not isinstance(key, str) or not key.strip() or len(key) > MAX_TAG_KEY:
            errors.add(at, tag, f"a tag name is a non-empty string of at most {MAX_TAG_KEY} characters", "rename it")
            ok = False
        elif _CREDENTIAL_NAME.search(key):
            errors.add(
                at,
                "<not shown>",
                "looks like a credential, and tags are visible to everyone who can read the MLflow experiment (and "
                "the spec is stored beside the experiment)",
                "keep credentials out of tags; rename the tag if it is none",
            )
            ok = False
        elif key.startswith(RESERVED_TAG_PREFIXES):
            errors.add(
                at,
                tag,
                "is a reserved tag name (airflow-tune sets airflow_tune.*, MLflow sets mlflow.*)",
                "use a name without these prefixes",
            )
            ok = False
        elif not isinstance(tag, str) or len(tag) > MAX_TAG_VALUE:
            errors.add(at, tag, f"must be a string of at most {MAX_TAG_VALUE} characters", "write it as a string")
            ok = False
    return ok


def check_no_double_tracking(tracking: Any, callbacks: Any, errors: Errors) -> None:
    """Refuse Tune's own MLflow logger beside tracking: each trial would be logged twice, as two runs."""
    if not tracking or not isinstance(callbacks, list):
        return
    for i, entry in enumerate(callbacks):
        full = normalize_callback(entry)
        if isinstance(full, Mapping) and "name" in full and logger_name(full["name"]) == "mlflow":
            errors.add(
                f"callbacks[{i}]",
                full["name"],
                "Tune's MLflow logger beside mlflow tracking would log every trial twice",
                "drop this callback: mlflow tracking logs each trial as a run under the experiment's parent run",
            )
