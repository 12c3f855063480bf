"""What a Ray cluster runs, as its dashboard says: its Ray release and its Python.

The Airflow side asks before submitting: the engine runs on the cluster's Python with the cluster's Ray, and a
trainable pickled by value loads only on the Python minor it was pickled on.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow_tune.exceptions import RayConnectionError
from airflow_tune.hooks.connection import RayEndpoint
from airflow_tune.hooks.transport import CONNECT_TIMEOUT, status_error, translate_error


class ClusterVersions(NamedTuple):
    """The cluster's Ray version and Python version (``3.13.1``; None where the dashboard does not say)."""

    ray: str
    python: str | None


def _get(endpoint: RayEndpoint, path: str, request_timeout: float) -> Any:
    import requests

    try:
        return requests.get(
            f"{endpoint.url}{path}",
            headers=endpoint.headers,
            cookies=endpoint.cookies,
            verify=endpoint.verify,
            timeout=(CONNECT_TIMEOUT, min(request_timeout, 30.0)),
        )
    except Exception as exc:
        raise translate_error(exc, url=endpoint.url, action="read its version") from exc


def _from_metadata(resp: Any) -> ClusterVersions | None:
    """The versions in an answer to ``GET /api/v0/cluster_metadata`` (the head's, which every node must match)."""
    try:
        data = resp.json()["data"]
        ray = data.get("rayVersion") or data.get("ray_version")
        python = data.get("pythonVersion") or data.get("python_version")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return ClusterVersions(str(ray), str(python) if python else None) if ray else None


def read_cluster_versions(endpoint: RayEndpoint, request_timeout: float) -> ClusterVersions:
    """The cluster's versions: ``GET /api/v0/cluster_metadata`` (Ray and Python, every supported release answers it
    once its head has started), else ``GET /api/version`` (Ray only).

    :param endpoint: the dashboard.
    :param request_timeout: seconds to wait for each answer (at most 30).
    """
    resp = _get(endpoint, "/api/v0/cluster_metadata", request_timeout)
    if resp.status_code in (401, 403):
        raise status_error(resp.status_code, resp.text, url=endpoint.url, action="read its version", job_id=None)
    found = _from_metadata(resp) if resp.status_code < 400 else None
    if found is not None:
        return found
    resp = _get(endpoint, "/api/version", request_timeout)
    if resp.status_code >= 400:
        raise status_error(resp.status_code, resp.text, url=endpoint.url, action="read its version", job_id=None)
    try:
        return ClusterVersions(str(resp.json()["ray_version"]), None)
    except (ValueError, KeyError, TypeError):
        raise RayConnectionError(
            f"{endpoint.url} answered GET /api/version, but not as a Ray dashboard does (no Ray version in it)."
        ) from None


def refuse_unsupported(url: str, there: ClusterVersions) -> None:
    """Raise RayConnectionError when the cluster at ``url`` runs a Ray or Python the engine does not run on
    (:data:`airflow_tune.common.versions.SUPPORTED_RAY`, :data:`~airflow_tune.common.versions.SUPPORTED_PYTHON`).

    The engine (``airflow_tune.engine``, shipped with each job) runs on the cluster with the cluster's Python and
    Ray, and is tested on every release of those ranges; the Airflow side's Ray plays no part here.
    """
    from airflow_tune.common.versions import python_version_problem, ray_version_problem

    problem = ray_version_problem(there.ray)
    if problem:
        raise RayConnectionError(
            f"The Ray cluster at {url} runs Ray {there.ray}, which airflow-tune cannot run its engine on: {problem}. "
            "Run a Ray release in that range on the cluster, or point the connection at a cluster that does; "
            "nothing was written or submitted."
        )
    problem = python_version_problem(there.python) if there.python else None
    if problem:
        raise RayConnectionError(
            f"The Ray cluster at {url} runs Python {there.python}, which airflow-tune cannot run its engine on: "
            f"{problem}. Run the cluster's Ray on a Python in that range (Ray's images have one for each), or point "
            "the connection at a cluster that does; nothing was written or submitted."
        )
