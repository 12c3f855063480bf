"""The package's own sync client of Ray's Jobs REST API (the dashboard's ``/api/jobs/`` and ``/api/packages/``), over
``requests``: what the hook needs of Ray's ``JobSubmissionClient`` without Ray on this side.

The wire format is Ray's (``ray/dashboard/modules/job/sdk.py``, the same from 2.43 to 2.60): a job is submitted as
``POST /api/jobs/`` with a JSON body from which keys whose value is None are left out (older servers refuse unknown
keys); a package is ``PUT /api/packages/gcs/<name>`` with the zip as the body, and ``GET`` of it answers 200 when it
exists (and pins it for a while). Every request carries a connect/read timeout; the address comes only from the
connection (RAY_ADDRESS and RAY_API_SERVER_ADDRESS are never read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.transport import CONNECT_TIMEOUT, quote_id, status_error, translate_error

if TYPE_CHECKING:
    import requests

    from airflow_tune.hooks.connection import RayEndpoint


def submit_body(
    *,
    entrypoint: str,
    submission_id: str | None,
    runtime_env: dict[str, Any] | None,
    metadata: dict[str, str] | None,
    entrypoint_num_cpus: float | None = None,
    entrypoint_resources: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The JSON body of ``POST /api/jobs/``, as Ray's client sends it (None values left out)."""
    body = {
        "entrypoint": entrypoint,
        "submission_id": submission_id,
        "runtime_env": runtime_env or {},
        "metadata": metadata or {},
        "entrypoint_num_cpus": entrypoint_num_cpus,
        "entrypoint_resources": entrypoint_resources,
    }
    return {key: value for key, value in body.items() if value is not None}


class JobsClient:
    """Sync calls to one dashboard's Jobs API; errors become the package's exceptions (see
    :func:`~airflow_tune.hooks.transport.status_error`). No retries here: the hook retries the idempotent calls.

    :param endpoint: the dashboard and its credentials (headers, cookies, verify).
    :param request_timeout: seconds to wait for each answer (connecting waits at most ``CONNECT_TIMEOUT``).
    """

    def __init__(self, endpoint: RayEndpoint, request_timeout: float) -> None:
        import requests

        self.endpoint = endpoint
        self.address = endpoint.url
        self.timeout = (CONNECT_TIMEOUT, request_timeout)
        self._session = requests.Session()
        self._session.headers.update(endpoint.headers)
        self._session.cookies.update(dict(endpoint.cookies))
        self._session.verify = endpoint.verify

    def close(self) -> None:
        self._session.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        action: str,
        job_id: str | None = None,
        allow: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> requests.Response:
        """Send one request; an answer of 400 or more raises (see :func:`status_error`).

        :param method: the HTTP method.
        :param path: the REST path, starting with ``/``, ids already quoted.
        :param action: what the request is for, for error messages.
        :param job_id: the job asked about, so a 404 reads "not found".
        :param allow: error statuses returned rather than raised.
        """
        url = self.address
        try:
            resp = self._session.request(method, url + path, timeout=self.timeout, **kwargs)
        except Exception as exc:
            raise translate_error(exc, url=url, action=action, job_id=job_id) from exc
        if resp.status_code >= 400 and resp.status_code not in allow:
            raise status_error(resp.status_code, resp.text, url=url, action=action, job_id=job_id)
        return resp

    def json(self, method: str, path: str, *, action: str, job_id: str | None = None, **kwargs: Any) -> Any:
        resp = self.request(method, path, action=action, job_id=job_id, **kwargs)
        try:
            return resp.json()
        except ValueError:
            raise RayJobError(
                f"The Ray Jobs API at {self.address} answered {method} {path} with no JSON (to {action}): "
                f"{resp.text[:200]!r}"
            ) from None

    # -- jobs -------------------------------------------------------------------------------------------------------
    def submit_job(self, **fields: Any) -> str:
        """Submit a job (fields as :func:`submit_body` takes them); return its submission id."""
        sid = fields.get("submission_id")
        data = self.json("POST", "/api/jobs/", action=f"submit job {sid!r}", job_id=sid, json=submit_body(**fields))
        return str(data["submission_id"])

    def get_job_info(self, job_id: str) -> dict[str, Any]:
        """A job's details as the dashboard gives them (``GET /api/jobs/<id>``)."""
        return dict(self.json("GET", f"/api/jobs/{quote_id(job_id)}", action=f"read job {job_id!r}", job_id=job_id))

    def list_jobs(self) -> list[dict[str, Any]]:
        """Every job the cluster knows (``GET /api/jobs/``)."""
        return list(self.json("GET", "/api/jobs/", action="list jobs"))

    def stop_job(self, job_id: str) -> bool:
        """Ask Ray to stop a job; whether it was still running (``POST /api/jobs/<id>/stop``)."""
        path = f"/api/jobs/{quote_id(job_id)}/stop"
        return bool(self.json("POST", path, action=f"stop job {job_id!r}", job_id=job_id)["stopped"])

    def get_job_logs(self, job_id: str) -> str:
        """A job's driver log so far (``GET /api/jobs/<id>/logs``)."""
        path = f"/api/jobs/{quote_id(job_id)}/logs"
        return str(self.json("GET", path, action=f"read the logs of job {job_id!r}", job_id=job_id).get("logs", ""))

    # -- packages ---------------------------------------------------------------------------------------------------
    def package_exists(self, package_name: str) -> bool:
        """Whether the cluster holds ``gcs://<package_name>``; asking pins it for a while, as Ray's client relies on.

        :param package_name: e.g. ``_ray_pkg_<hash>.zip``.
        """
        action = f"look for package {package_name}"
        resp = self.request("GET", f"/api/packages/gcs/{quote_id(package_name)}", action=action, allow=(404,))
        return resp.status_code != 404

    def upload_package(self, package_name: str, data: bytes) -> None:
        """Store a zip on the cluster as ``gcs://<package_name>`` (``PUT /api/packages/gcs/<name>``)."""
        self.request("PUT", f"/api/packages/gcs/{quote_id(package_name)}", action=f"upload {package_name}", data=data)
