"""Hook for the Jobs API of a Ray cluster, reached through its dashboard address.

The sync methods talk REST with ``requests`` (:mod:`~airflow_tune.hooks.jobs_client`), the async ones with aiohttp,
for triggers; neither needs Ray on this side. Local folders of a job's runtime_env become packages on the cluster
(:mod:`~airflow_tune.hooks.packages`: the engine by the provider, other local code by Ray's client, which needs the
``ray`` extra). The pieces: :mod:`~airflow_tune.hooks.connection` (the connection as an endpoint),
:mod:`~airflow_tune.hooks.transport` (wire format, errors, retries, sessions) and
:mod:`~airflow_tune.hooks.status_poll` (the job list shared by every trigger). aiohttp and requests are imported
inside the methods that need them, so importing this module (DAG parsing) stays cheap.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from airflow_tune.exceptions import AirflowTuneException, RayJobNotFoundError
from airflow_tune.hooks.cluster_versions import ClusterVersions, read_cluster_versions, refuse_unsupported
from airflow_tune.hooks.connection import RayEndpoint, merge_runtime_env, stringify_metadata
from airflow_tune.hooks.status_poll import JobWatch, shared_job_status, watch
from airflow_tune.hooks.submission import submit_once
from airflow_tune.hooks.transport import (
    AsyncTransport,
    job_to_dict,
    metadata_matches,
    newest_first,
    quote_id,
    retrying,
    translate_error,
)

if TYPE_CHECKING:
    from airflow_tune.hooks.jobs_client import JobsClient


class RayHook(BaseHook):
    """Submit, watch and stop jobs on a Ray cluster through its dashboard's Jobs API.

    The connection (type ``ray_tune``; one of the type ``ray``, which airflow-tune registered before, is read the same
    way) gives the dashboard address as host/port/schema or a full URL in host, an optional token in the password
    (sent as ``Authorization: Bearer``), and optional extras ``dashboard_url`` (the dashboard as a browser opens it, for
    links), ``headers``, ``cookies``, ``verify``, ``runtime_env`` and ``metadata`` (defaults merged under each job's).
    A connection written for astro-provider-ray (a ``ray://`` Ray Client address, or an ``address`` extra and no
    host) is refused, saying what to write (see :func:`~airflow_tune.hooks.connection.astro_connection_problem`).

    :param ray_conn_id: the Airflow connection id.
    :param request_timeout: seconds to wait for an answer to each request.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    #: Not ``ray``: astro-provider-ray registers that type too, and Airflow gives a type to one hook only.
    conn_type = "ray_tune"
    hook_name = "Ray Tune (airflow-tune)"

    def __init__(self, ray_conn_id: str = default_conn_name, request_timeout: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.request_timeout = request_timeout
        self._endpoint: RayEndpoint | None = None
        self._client: JobsClient | None = None
        self._transport: AsyncTransport | None = None
        self._cluster_versions: ClusterVersions | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ray_conn_id={self.ray_conn_id!r})"

    # -- connection form ------------------------------------------------------------------------------------------
    @classmethod
    def _declared_form(cls) -> dict[str, Any]:
        from airflow_tune.get_provider_info import get_provider_info

        for conn_type in get_provider_info().get("connection-types", []):
            if conn_type.get("connection-type") == cls.conn_type:
                return conn_type
        return {}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """Form fields for Airflow before 3.2; later versions read ``conn-fields`` from the provider info."""
        try:
            from wtforms import StringField
        except ImportError:
            return {}
        fields = cls._declared_form().get("conn-fields", {})
        return {
            name: StringField(spec["label"], description=spec.get("description", "")) for name, spec in fields.items()
        }

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Field behaviour for Airflow before 3.2; later versions read ``ui-field-behaviour`` from the provider info."""
        behaviour = cls._declared_form().get("ui-field-behaviour", {})
        return {
            "hidden_fields": list(behaviour.get("hidden-fields", [])),
            "relabeling": dict(behaviour.get("relabeling", {})),
            "placeholders": dict(behaviour.get("placeholders", {})),
        }

    # -- connection -----------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> RayEndpoint:
        """The resolved dashboard address and credentials (looks the connection up once)."""
        if self._endpoint is None:
            conn = self.get_connection(self.ray_conn_id)
            self._endpoint = RayEndpoint.from_connection(conn, conn.extra_dejson)
        return self._endpoint

    async def aget_endpoint(self) -> RayEndpoint:
        """Async :attr:`endpoint`, safe in the triggerer's event loop."""
        if self._endpoint is None:
            conn = await self.aget_connection(self.ray_conn_id)
            aextra = getattr(conn, "aextra_dejson", None)
            if aextra is not None:
                extra = await aextra()
            else:  # Airflow before 3.2: extra_dejson masks secrets through a sync call
                from asgiref.sync import sync_to_async

                extra = await sync_to_async(lambda: conn.extra_dejson)()
            self._endpoint = RayEndpoint.from_connection(conn, extra)
        return self._endpoint

    @property
    def dashboard_url(self) -> str:
        """The dashboard's base URL for links a person opens: the extra ``dashboard_url``, else the host's URL (which
        the API calls always use, :attr:`endpoint` ``.url``)."""
        return self.endpoint.dashboard_url

    @property
    def allowed_code_references(self) -> tuple[str, ...]:
        """Import-path patterns the connection's extra ``allowed_code_references`` allow-lists."""
        return self.endpoint.allowed_code_references

    @property
    def allowed_storage_roots(self) -> tuple[str, ...]:
        """Storage roots the connection's extra ``allowed_storage_roots`` allows (see
        :mod:`airflow_tune.trust.roots`)."""
        return self.endpoint.allowed_storage_roots

    def job_url(self, job_id: str) -> str:
        """The dashboard page of a job, as a browser opens it (see :attr:`dashboard_url`).

        :param job_id: the submission id.
        """
        return f"{self.dashboard_url}/#/jobs/{quote(job_id, safe=':+@')}"

    def get_conn(self) -> JobsClient:
        """Return the Jobs REST client for the connection (created on first use, then reused; no request sent)."""
        if self._client is None:
            from airflow_tune.hooks.jobs_client import JobsClient

            self._client = JobsClient(self.endpoint, self.request_timeout)
        return self._client

    def test_connection(self) -> tuple[bool, str]:
        """Ask the dashboard for the cluster's Ray and Python versions; return (ok, message). A cluster outside the
        supported ranges fails the test, as it would fail every task."""
        try:
            versions = self.check_cluster_versions()
        except Exception as exc:
            return False, str(exc) if isinstance(exc, AirflowTuneException) else f"{type(exc).__name__}: {exc}"
        on_python = f" on Python {versions.python}" if versions.python else ""
        return True, f"Connected to Ray {versions.ray}{on_python} at {self.endpoint.url}"

    def get_cluster_versions(self) -> ClusterVersions:
        """The Ray and Python versions the cluster runs, as its dashboard says (``GET /api/v0/cluster_metadata``;
        Python is None where only ``GET /api/version`` answers)."""
        return read_cluster_versions(self.endpoint, self.request_timeout)

    def get_ray_version(self) -> str:
        """The Ray version the cluster runs, as its dashboard says."""
        return self.get_cluster_versions().ray

    def check_cluster_versions(self) -> ClusterVersions:
        """Return the cluster's versions; raise RayConnectionError when its Ray or Python is outside what the engine
        runs on (see :func:`~airflow_tune.hooks.cluster_versions.refuse_unsupported`)."""
        there = self.get_cluster_versions()
        refuse_unsupported(self.endpoint.url, there)
        self._cluster_versions = there
        return there

    def check_ray_version(self) -> str:
        """Return the cluster's Ray version after :meth:`check_cluster_versions`."""
        return self.check_cluster_versions().ray

    def cluster_python(self) -> str | None:
        """The cluster's Python version as the last check read it (no request; None before a check)."""
        return self._cluster_versions.python if self._cluster_versions else None

    @contextlib.contextmanager
    def _translated(self, action: str, job_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            raise translate_error(exc, url=self.endpoint.url, action=action, job_id=job_id) from exc

    # -- sync Jobs API --------------------------------------------------------------------------------------------
    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_resources: dict[str, float] | None = None,
        same_ray_version: bool = True,
    ) -> str:
        """Submit a job and return its submission id.

        :param entrypoint: the shell command the driver runs.
        :param submission_id: the job's id; a reused id fails (Ray keeps finished jobs).
        :param runtime_env: the job's runtime_env, laid over the connection's default (``env_vars`` merge by key).
        :param metadata: the job's metadata, laid over the connection's default; values become strings.
        :param entrypoint_num_cpus: CPUs reserved for the driver.
        :param entrypoint_resources: custom resources reserved for the driver.
        :param same_ray_version: first refuse a cluster whose Ray version is outside the supported range
            (:meth:`check_ray_version`), so a mismatch fails before anything is submitted.

        A submission Ray handed to no job agent (none had registered yet, as on a head that just started) is sent
        again a few times. One whose answer was lost (dropped connection, timeout, HTTP 5xx) is settled by looking the
        job up by its id: found with this entrypoint and metadata, it is this submission; not found, it is sent again.

        Local ``py_modules``/``working_dir`` paths are uploaded first (see :func:`ship_local_code`).
        """
        endpoint = self.endpoint
        if same_ray_version:
            self.check_ray_version()
        env = self.ship_local_code(merge_runtime_env(endpoint.runtime_env, runtime_env))
        self.log.info("Submitting Ray job %s to %s", submission_id, endpoint.url)
        fields = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": env or None,
            "metadata": {**endpoint.metadata, **stringify_metadata(metadata)} or None,
            "entrypoint_num_cpus": entrypoint_num_cpus,
            "entrypoint_resources": entrypoint_resources or None,
        }
        return submit_once(self.get_conn(), fields, self.log)

    def ship_local_code(self, runtime_env: dict[str, Any]) -> dict[str, Any]:
        """``runtime_env`` with its local ``py_modules``/``working_dir`` uploaded and replaced by ``gcs://`` URIs.

        The engine package (``airflow_tune``) is uploaded by the provider itself, once per content; other local
        code by Ray's client (the ``ray`` extra; without it, :class:`~airflow_tune.hooks.ray_extra.RayExtraMissing`).

        :param runtime_env: the job's runtime_env.
        """
        from airflow_tune.hooks.packages import engine_dir, ship_local_paths

        return ship_local_paths(
            self.get_conn(), runtime_env, engine_dir=engine_dir(), request_timeout=self.request_timeout
        )

    def get_job_info(self, job_id: str) -> dict[str, Any]:
        """Return a job's details as a plain dict (see ``JOB_FIELDS``); ``status`` is a string like ``"RUNNING"``.

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        for attempt in retrying():
            with attempt, self._translated(f"read job {job_id!r}", job_id=job_id):
                return job_to_dict(client.get_job_info(job_id))
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    def get_job_status(self, job_id: str) -> str:
        """Return a job's status: PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED.

        :param job_id: the submission id (or Ray job id).
        """
        return str(self.get_job_info(job_id)["status"])

    def list_jobs(self) -> list[dict[str, Any]]:
        """Return every job the cluster knows, as plain dicts."""
        client = self.get_conn()
        for attempt in retrying():
            with attempt, self._translated("list jobs"):
                return [job_to_dict(job) for job in client.list_jobs()]
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        """Return the jobs whose metadata holds every key/value of ``metadata_filter``, newest first.

        :param metadata_filter: keys and values to match (compared as strings).
        """
        return newest_first([job for job in self.list_jobs() if metadata_matches(job["metadata"], metadata_filter)])

    def stop_job(self, job_id: str) -> bool:
        """Ask Ray to stop a job; return whether it was still running. Stopping is idempotent, so a stop whose answer
        was lost is sent again like a read (its answer is then False if the first stop already ended the job).

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        self.log.info("Stopping Ray job %s on %s", job_id, self.endpoint.url)
        for attempt in retrying():
            with attempt, self._translated(f"stop job {job_id!r}", job_id=job_id):
                return client.stop_job(job_id)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    def get_job_logs(self, job_id: str) -> str:
        """Return a job's driver log so far.

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        for attempt in retrying():
            with attempt, self._translated(f"read the logs of job {job_id!r}", job_id=job_id):
                return client.get_job_logs(job_id)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    # -- async Jobs API (for triggers) ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def async_session(self) -> AsyncIterator[RayHook]:
        """Hold one HTTP session for every async call made inside the block (a trigger's whole run)."""
        endpoint = await self.aget_endpoint()
        async with AsyncTransport(endpoint, self.request_timeout) as transport:
            self._transport = transport
            try:
                yield self
            finally:
                self._transport = None

    @contextlib.asynccontextmanager
    async def watch_job(self, job_id: str) -> AsyncIterator[JobWatch]:
        """Watch a job through its dashboard's one shared poll (``GET /api/jobs/`` every 0.5 s while anyone watches,
        whatever the number of watchers); :meth:`JobWatch.changed` wakes a watcher only when its job's status changes.

        :param job_id: the submission id.
        """
        job_watch = watch(await self.aget_endpoint(), self.request_timeout, job_id)
        try:
            yield job_watch
        finally:
            job_watch.close()

    async def _aget(self, path: str, *, action: str, job_id: str | None = None) -> Any:
        if self._transport is not None:
            return await self._transport.get_json(path, action=action, job_id=job_id)
        async with AsyncTransport(await self.aget_endpoint(), self.request_timeout) as transport:
            return await transport.get_json(path, action=action, job_id=job_id)

    async def async_get_job_info(self, job_id: str) -> dict[str, Any]:
        """Async :meth:`get_job_info`.

        :param job_id: the submission id (or Ray job id).
        """
        data = await self._aget(f"/api/jobs/{quote_id(job_id)}", action=f"read job {job_id!r}", job_id=job_id)
        return job_to_dict(data)

    async def async_get_job_logs(self, job_id: str) -> str:
        """Async :meth:`get_job_logs`.

        :param job_id: the submission id (or Ray job id).
        """
        path = f"/api/jobs/{quote_id(job_id)}/logs"
        data = await self._aget(path, action=f"read the logs of job {job_id!r}", job_id=job_id)
        return str(data.get("logs", ""))

    async def async_list_jobs(self) -> list[dict[str, Any]]:
        """Async :meth:`list_jobs`."""
        return [job_to_dict(job) for job in await self._aget("/api/jobs/", action="list jobs")]

    async def async_job_status(self, job_id: str, max_age: float) -> dict[str, Any] | None:
        """Return a job's details from a job list shared by every caller in this process; None if the job is unknown.

        All callers watching the same dashboard (with the same credentials) share one ``GET /api/jobs/`` per
        ``max_age`` seconds (see :mod:`airflow_tune.hooks.status_poll`), so the load on the dashboard does not grow
        with the number of watched jobs. A job missing from the list (submitted since) is asked for on its own.

        :param job_id: the submission id (or Ray job id).
        :param max_age: seconds a fetched list may be reused.
        """
        if self._transport is None:
            async with self.async_session():
                return await self.async_job_status(job_id, max_age)
        job = await shared_job_status(self._transport, job_id, max_age)
        if job is not None:
            return job
        try:
            return await self.async_get_job_info(job_id)
        except RayJobNotFoundError:
            return None
