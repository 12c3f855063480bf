"""The namespace OpenLineage gives a server (``scheme://host[:port]``): shared by the datasets' names
(:mod:`airflow_tune.utils.lineage`) and the run parameters (:mod:`airflow_tune.utils.lineage_parameters`), so no
credential a URI carries (userinfo, query, fragment) reaches an event."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit


def server_namespace(uri: Any, default: str = "mlflow") -> str:
    """The namespace of a server's URI (the MLflow tracking server's): ``scheme://host[:port]``, without userinfo,
    path, query or fragment; ``default`` when it is none."""
    try:
        parts = urlsplit(str(uri or ""))
        port = parts.port
    except ValueError:
        return default
    if not parts.scheme or not parts.hostname:
        return default
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme.lower()}://{host}" + (f":{port}" if port is not None else "")
