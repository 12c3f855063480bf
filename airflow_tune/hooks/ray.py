"""Hook for the Jobs API of a Ray cluster, reached through its dashboard address.

The sync methods use Ray's ``JobSubmissionClient`` (it uploads local ``working_dir``/``py_modules``, which REST cannot);
the async methods talk REST with aiohttp, for triggers. Ray, aiohttp and requests are imported inside the methods that
need them, so importing this module (DAG parsing) stays cheap.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

from airflow.sdk import BaseHook

from airflow_tune.exceptions import AirflowTuneException, RayConnectionError, RayJobError, RayJobNotFoundError

if TYPE_CHECKING:
    import ssl

    from airflow.sdk import Connection
    from ray.job_submission import JobSubmissionClient

DEFAULT_PORT = 8265
DEFAULT_SCHEME = "http"
CONNECT_TIMEOUT = 10.0
TERMINAL_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})

# Fields of a job safe to hand on (XCom, events, logs). ``runtime_env`` is left out: its env_vars may hold secrets.
JOB_FIELDS = (
    "submission_id",
    "job_id",
    "type",
    "status",
    "message",
    "error_type",
    "metadata",
    "start_time",
    "end_time",
    "entrypoint",
    "driver_exit_code",
)


# -- pure helpers ---------------------------------------------------------------------------------------------------


def build_dashboard_url(host: str | None, port: int | None = None, schema: str | None = None) -> str:
    """Return the dashboard base URL (no trailing slash) of a connection's host, port and schema.

    :param host: a host name or address, ``host:port``, or a full URL such as ``https://ray.example.com/ray``.
    :param port: the dashboard port; a port in ``host`` wins. Default 8265, but a full URL keeps its scheme's default.
    :param schema: ``http`` or ``https`` (default ``http``); ignored when ``host`` is a full URL.
    """
    host = (host or "").strip()
    if not host:
        raise RayConnectionError(
            "The Ray connection has no host: set the dashboard host (e.g. 127.0.0.1) or a full URL "
            "(e.g. http://ray-head:8265)."
        )
    if "://" in host:
        parts = urlsplit(host)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise RayConnectionError(
                f"The Ray connection's host {host!r} is not an http(s) URL: use e.g. http://ray-head:8265."
            )
        if parts.username or parts.password:
            raise RayConnectionError(
                "The Ray connection's host URL holds credentials: remove them and put the token in the password."
            )
        netloc = parts.netloc
        if parts.port is None and port:
            netloc = f"{netloc}:{port}"
        return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    scheme = (schema or DEFAULT_SCHEME).strip().lower()
    if scheme not in ("http", "https"):
        raise RayConnectionError(
            f"The Ray connection's schema is {schema!r}: use 'http' or 'https', or leave it empty for http."
        )
    name, sep, host_port = host.rpartition(":")
    if sep and host.count(":") == 1 and host_port.isdigit():
        host, port = name, int(host_port)
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal needs brackets in a URL
    return f"{scheme}://{host.rstrip('/')}:{port or DEFAULT_PORT}"


def merge_runtime_env(default: Mapping[str, Any] | None, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return ``given`` laid over ``default``: top-level keys of ``given`` win, ``env_vars`` merge key by key.

    :param default: the connection's default runtime_env.
    :param given: the job's own runtime_env.
    """
    merged: dict[str, Any] = copy.deepcopy(dict(default or {}))
    for key, value in (given or {}).items():
        if key == "env_vars" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **copy.deepcopy(dict(value))}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def stringify_metadata(metadata: Mapping[str, Any] | None) -> dict[str, str]:
    """Return metadata with string values, as Ray stores them (``Dict[str, str]``).

    :param metadata: keys and values; non-string values are converted with ``str``.
    """
    return {str(k): v if isinstance(v, str) else str(v) for k, v in (metadata or {}).items()}


def metadata_matches(job_metadata: Mapping[str, Any] | None, metadata_filter: Mapping[str, Any]) -> bool:
    """Whether a job's metadata holds every key/value of ``metadata_filter`` (compared as strings).

    :param job_metadata: the job's metadata.
    :param metadata_filter: keys and values the job must carry.
    """
    job_metadata = job_metadata or {}
    return all(job_metadata.get(k) == v for k, v in stringify_metadata(metadata_filter).items())


def newest_first(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sort jobs by start time, newest first; a job without a start time counts as newest.

    :param jobs: job dicts as returned by :func:`job_to_dict`.
    """
    return sorted(jobs, key=lambda j: j.get("start_time") or float("inf"), reverse=True)


def job_to_dict(job: Any) -> dict[str, Any]:
    """Return a plain JSON-able dict of a Ray ``JobDetails`` object or of its REST JSON.

    :param job: a ``JobDetails`` or a mapping with the same fields.
    """
    if isinstance(job, Mapping):
        out = {name: job.get(name) for name in JOB_FIELDS}
    else:
        out = {name: getattr(job, name, None) for name in JOB_FIELDS}
    for name in ("status", "type"):
        value = out[name]
        # Ray's enums subclass str, but str() of one gives "JobStatus.RUNNING".
        out[name] = getattr(value, "value", value)
    out["metadata"] = dict(out["metadata"] or {})
    return out


def quote_id(job_id: str) -> str:
    """Quote a submission id for a REST path (ids may hold ``:``, ``+`` or ``/``).

    :param job_id: a submission id or Ray job id.
    """
    return quote(job_id, safe="")


def _extra_value(extra: Mapping[str, Any], name: str) -> Any:
    # Older connection forms stored form fields as "extra__<conn_type>__<name>".
    value = extra.get(name, extra.get(f"extra__ray__{name}"))
    return None if value == "" else value


def _extra_dict(extra: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = _extra_value(extra, name)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    if not isinstance(value, dict):
        raise RayConnectionError(f"The Ray connection's extra {name!r} must be a JSON object.")
    return value


def _extra_verify(extra: Mapping[str, Any]) -> bool | str:
    value = _extra_value(extra, "verify")
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        return value.strip()
    raise RayConnectionError("The Ray connection's extra 'verify' must be true, false or a CA bundle path.")


@dataclass(frozen=True, repr=False)
class RayEndpoint:
    """Where and how to reach a Ray dashboard, resolved from an Airflow connection.

    :param url: dashboard base URL, no trailing slash.
    :param headers: HTTP headers for every request, including ``Authorization`` when the connection has a token.
    :param cookies: cookies for every request.
    :param verify: verify TLS (bool) or the path of a CA bundle.
    :param runtime_env: default runtime_env merged under each job's.
    :param metadata: default metadata added to each job's.
    """

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    verify: bool | str = True
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        # Headers and cookies carry credentials: show only their names.
        return (
            f"RayEndpoint(url={self.url!r}, headers={sorted(self.headers)}, cookies={sorted(self.cookies)}, "
            f"verify={self.verify!r})"
        )

    @property
    def credentials_key(self) -> str:
        """A digest of the credentials, so callers with different credentials never share a cached answer."""
        blob = json.dumps([sorted(self.headers.items()), sorted(self.cookies.items())])
        return hashlib.sha256(blob.encode()).hexdigest()

    @classmethod
    def from_connection(cls, conn: Connection, extra: Mapping[str, Any]) -> RayEndpoint:
        """Resolve a connection and its parsed extra.

        :param conn: the Airflow connection (type ``ray``).
        :param extra: the connection's extra as a dict.
        """
        url = build_dashboard_url(conn.host, conn.port, conn.schema)
        headers = {str(k): str(v) for k, v in _extra_dict(extra, "headers").items()}
        if conn.password:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {conn.password}"
        return cls(
            url=url,
            headers=headers,
            cookies={str(k): str(v) for k, v in _extra_dict(extra, "cookies").items()},
            verify=_extra_verify(extra),
            runtime_env=_extra_dict(extra, "runtime_env"),
            metadata=stringify_metadata(_extra_dict(extra, "metadata")),
        )


# -- errors ---------------------------------------------------------------------------------------------------------

_STATUS_RE = re.compile(r"status code (\d{3})")


def _status_error(status: int, body: str, *, url: str, action: str, job_id: str | None) -> AirflowTuneException:
    """Translate an HTTP error answer of the Jobs API."""
    exists = "already exists" in body
    lines = [line.strip() for line in body.splitlines() if line.strip(" .")]
    # Ray answers some errors with a whole server traceback: its last line is the one that says what went wrong.
    body = (lines[-1] if "Traceback (most recent call last)" in body else " ".join(lines))[:500] if lines else ""
    if status in (401, 403):
        return RayConnectionError(
            f"The Ray dashboard at {url} rejected the credentials (HTTP {status}) to {action}: "
            "check the token in the connection's password."
        )
    if status == 404 and job_id is not None:
        return RayJobNotFoundError(f"Ray job {job_id!r} not found on {url}.")
    if exists:
        return RayJobError(f"Ray job {job_id!r} already exists on {url}: use another submission id. ({body})")
    return RayJobError(f"The Ray Jobs API at {url} failed to {action} (HTTP {status}): {body}")


def _translate_error(exc: Exception, *, url: str, action: str, job_id: str | None = None) -> AirflowTuneException:
    """Translate an exception of Ray's client (or of requests under it)."""
    if isinstance(exc, AirflowTuneException):
        return exc
    text = str(exc)
    if type(exc).__name__ == "AuthenticationError":
        status = 403 if "failed" in text.lower() else 401
        return _status_error(status, "", url=url, action=action, job_id=job_id)
    if isinstance(exc, OSError):  # ConnectionError, requests' ConnectionError/Timeout, a missing CA bundle
        return RayConnectionError(f"Cannot reach the Ray dashboard at {url} to {action}: {text}")
    match = _STATUS_RE.search(text)
    if match:
        return _status_error(int(match.group(1)), text, url=url, action=action, job_id=job_id)
    return RayJobError(f"The Ray Jobs API at {url} failed to {action}: {type(exc).__name__}: {text}")


# -- Ray's sync client ----------------------------------------------------------------------------------------------

_ADDRESS_ENV_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _ray_address_env_ignored() -> Iterator[None]:
    """Hide RAY_API_SERVER_ADDRESS / RAY_ADDRESS: Ray lets them override an explicit address; the connection wins."""
    with _ENV_LOCK:
        saved = {name: os.environ.pop(name) for name in _ADDRESS_ENV_VARS if name in os.environ}
        try:
            yield
        finally:
            os.environ.update(saved)


@functools.cache
def _client_class() -> type[JobSubmissionClient]:
    from ray.job_submission import JobSubmissionClient

    class _BoundedClient(JobSubmissionClient):
        """Ray's client sends requests with no timeout; a dead dashboard must not hang a task."""

        def __init__(self, address: str, *, request_timeout: float, **kwargs: Any) -> None:
            self._request_timeout = (CONNECT_TIMEOUT, request_timeout)
            super().__init__(address, **kwargs)

        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", self._request_timeout)
            return super()._do_request(method, endpoint, **kwargs)

    return _BoundedClient


# -- shared status poll ---------------------------------------------------------------------------------------------


@dataclass
class _SharedPoll:
    """The last job list of one dashboard, shared by every caller in this process's event loop."""

    loop: asyncio.AbstractEventLoop
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    fetched_at: float = float("-inf")
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: AirflowTuneException | None = None


# Keyed by (dashboard URL, credentials digest).
_SHARED_POLLS: dict[tuple[str, str], _SharedPoll] = {}


def _shared_poll(key: tuple[str, str]) -> _SharedPoll:
    loop = asyncio.get_running_loop()
    poll = _SHARED_POLLS.get(key)
    # An asyncio.Lock belongs to one loop; a new loop (a test, a restarted triggerer) gets a fresh entry.
    if poll is None or poll.loop is not loop:
        poll = _SHARED_POLLS[key] = _SharedPoll(loop=loop)
    return poll


@functools.lru_cache(maxsize=16)
def _ssl_context(cafile_or_dir: str) -> ssl.SSLContext:
    import ssl

    if os.path.isdir(cafile_or_dir):
        return ssl.create_default_context(capath=cafile_or_dir)
    return ssl.create_default_context(cafile=cafile_or_dir)


async def _get_json(endpoint: RayEndpoint, path: str, *, timeout: float, action: str, job_id: str | None = None) -> Any:
    """GET ``path`` of the dashboard and return the decoded JSON; errors become airflow-tune exceptions.

    :param endpoint: the dashboard to ask.
    :param path: the REST path, starting with ``/``, ids already quoted.
    :param timeout: total seconds for the request.
    :param action: what the request is for, for error messages.
    :param job_id: the job asked about, so a 404 reads "not found".
    """
    import aiohttp

    ssl_arg: Any = True
    if endpoint.verify is False:
        ssl_arg = False
    elif isinstance(endpoint.verify, str):
        try:
            ssl_arg = _ssl_context(endpoint.verify)
        except OSError as exc:
            raise RayConnectionError(f"Cannot load the CA bundle {endpoint.verify!r}: {exc}") from exc
    client_timeout = aiohttp.ClientTimeout(total=timeout, connect=CONNECT_TIMEOUT)
    try:
        async with aiohttp.ClientSession(
            headers=endpoint.headers, cookies=endpoint.cookies, timeout=client_timeout
        ) as session:
            async with session.get(endpoint.url + path, ssl=ssl_arg) as resp:
                if resp.status >= 400:
                    body = await resp.text()
                    raise _status_error(resp.status, body, url=endpoint.url, action=action, job_id=job_id)
                return await resp.json(content_type=None)
    except AirflowTuneException:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
        raise RayConnectionError(
            f"Cannot reach the Ray dashboard at {endpoint.url} to {action}: {type(exc).__name__}: {exc}"
        ) from exc


# -- the hook -------------------------------------------------------------------------------------------------------


class RayHook(BaseHook):
    """Submit, watch and stop jobs on a Ray cluster through its dashboard's Jobs API.

    The connection (type ``ray``) gives the dashboard address as host/port/schema or a full URL in host, an optional
    token in the password (sent as ``Authorization: Bearer``), and optional extras ``headers``, ``cookies``, ``verify``,
    ``runtime_env`` and ``metadata`` (defaults merged under each job's).

    :param ray_conn_id: the Airflow connection id.
    :param request_timeout: seconds to wait for an answer to each request.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str = default_conn_name, request_timeout: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self.request_timeout = request_timeout
        self._endpoint: RayEndpoint | None = None
        self._client: JobSubmissionClient | None = None

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
        """The dashboard base URL, e.g. ``http://127.0.0.1:8265``."""
        return self.endpoint.url

    def job_url(self, job_id: str) -> str:
        """The dashboard page of a job.

        :param job_id: the submission id.
        """
        return f"{self.dashboard_url}/#/jobs/{quote(job_id, safe=':+@')}"

    def get_conn(self) -> JobSubmissionClient:
        """Return Ray's ``JobSubmissionClient`` for the connection (created on first use, then reused)."""
        if self._client is None:
            endpoint = self.endpoint
            try:
                with _ray_address_env_ignored():
                    self._client = _client_class()(
                        endpoint.url,
                        request_timeout=self.request_timeout,
                        headers=dict(endpoint.headers),
                        cookies=dict(endpoint.cookies) or None,
                        verify=endpoint.verify,
                    )
            except Exception as exc:
                raise _translate_error(exc, url=endpoint.url, action="connect") from exc
        return self._client

    def test_connection(self) -> tuple[bool, str]:
        """Ask the dashboard for its Ray version (``GET /api/version``); return (ok, message)."""
        import requests

        try:
            endpoint = self.endpoint
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"
        action = "read its version"
        try:
            resp = requests.get(
                f"{endpoint.url}/api/version",
                headers=endpoint.headers,
                cookies=endpoint.cookies,
                verify=endpoint.verify,
                timeout=(CONNECT_TIMEOUT, min(self.request_timeout, 30.0)),
            )
            if resp.status_code >= 400:
                raise _status_error(resp.status_code, resp.text, url=endpoint.url, action=action, job_id=None)
            try:
                version = resp.json()["ray_version"]
            except (ValueError, KeyError, TypeError):
                return False, f"{endpoint.url} answered GET /api/version, but not as a Ray dashboard does."
        except Exception as exc:
            return False, str(_translate_error(exc, url=endpoint.url, action=action))
        return True, f"Connected to Ray {version} at {endpoint.url}"

    def get_ray_version(self) -> str:
        """The Ray version the cluster runs, as its dashboard says (``GET /api/version``)."""
        import requests

        endpoint = self.endpoint
        action = "read its Ray version"
        try:
            resp = requests.get(
                f"{endpoint.url}/api/version",
                headers=endpoint.headers,
                cookies=endpoint.cookies,
                verify=endpoint.verify,
                timeout=(CONNECT_TIMEOUT, min(self.request_timeout, 30.0)),
            )
        except Exception as exc:
            raise _translate_error(exc, url=endpoint.url, action=action) from exc
        if resp.status_code >= 400:
            raise _status_error(resp.status_code, resp.text, url=endpoint.url, action=action, job_id=None)
        try:
            return str(resp.json()["ray_version"])
        except (ValueError, KeyError, TypeError):
            raise RayConnectionError(
                f"{endpoint.url} answered GET /api/version, but not as a Ray dashboard does: no Ray version in it."
            ) from None

    def check_ray_version(self) -> str:
        """Return the cluster's Ray version; raise RayConnectionError when it is not the Ray version of this side.

        The engine (``airflow_tune.engine``, shipped with each job) runs on the cluster with the cluster's Ray and is
        built and tested against the Ray this side runs, so the two must be the same version.
        """
        from importlib.metadata import version

        here = version("ray")
        there = self.get_ray_version()
        if there != here:
            raise RayConnectionError(
                f"The Ray cluster at {self.endpoint.url} runs Ray {there}, but this Airflow side runs Ray {here}: "
                f"airflow-tune needs the same Ray version on both sides (its engine runs on the cluster with the "
                f"cluster's Ray). Run Ray {here} on the cluster; nothing was submitted."
            )
        return there

    @contextlib.contextmanager
    def _translated(self, action: str, job_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            raise _translate_error(exc, url=self.endpoint.url, action=action, job_id=job_id) from exc

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
        :param same_ray_version: first refuse a cluster whose Ray version differs from this side's
            (:meth:`check_ray_version`), so a mismatch fails before anything is submitted.
        """
        endpoint = self.endpoint
        kwargs: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": merge_runtime_env(endpoint.runtime_env, runtime_env) or None,
            "metadata": {**endpoint.metadata, **stringify_metadata(metadata)} or None,
        }
        if entrypoint_num_cpus is not None:
            kwargs["entrypoint_num_cpus"] = entrypoint_num_cpus
        if entrypoint_resources:
            kwargs["entrypoint_resources"] = entrypoint_resources
        if same_ray_version:
            self.check_ray_version()
        self.log.info("Submitting Ray job %s to %s", submission_id, endpoint.url)
        client = self.get_conn()
        with self._translated(f"submit job {submission_id!r}", job_id=submission_id):
            return client.submit_job(**kwargs)

    def get_job_info(self, job_id: str) -> dict[str, Any]:
        """Return a job's details as a plain dict (see ``JOB_FIELDS``); ``status`` is a string like ``"RUNNING"``.

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        with self._translated(f"read job {job_id!r}", job_id=job_id):
            return job_to_dict(client.get_job_info(quote_id(job_id)))

    def get_job_status(self, job_id: str) -> str:
        """Return a job's status: PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED.

        :param job_id: the submission id (or Ray job id).
        """
        return str(self.get_job_info(job_id)["status"])

    def list_jobs(self) -> list[dict[str, Any]]:
        """Return every job the cluster knows, as plain dicts."""
        client = self.get_conn()
        with self._translated("list jobs"):
            return [job_to_dict(job) for job in client.list_jobs()]

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        """Return the jobs whose metadata holds every key/value of ``metadata_filter``, newest first.

        :param metadata_filter: keys and values to match (compared as strings).
        """
        return newest_first([job for job in self.list_jobs() if metadata_matches(job["metadata"], metadata_filter)])

    def stop_job(self, job_id: str) -> bool:
        """Ask Ray to stop a job; return whether it was still running.

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        self.log.info("Stopping Ray job %s on %s", job_id, self.endpoint.url)
        with self._translated(f"stop job {job_id!r}", job_id=job_id):
            return bool(client.stop_job(quote_id(job_id)))

    def get_job_logs(self, job_id: str) -> str:
        """Return a job's driver log so far.

        :param job_id: the submission id (or Ray job id).
        """
        client = self.get_conn()
        with self._translated(f"read the logs of job {job_id!r}", job_id=job_id):
            return str(client.get_job_logs(quote_id(job_id)))

    # -- async Jobs API (for triggers) ----------------------------------------------------------------------------
    async def _aget(self, path: str, *, action: str, job_id: str | None = None) -> Any:
        endpoint = await self.aget_endpoint()
        return await _get_json(endpoint, path, timeout=self.request_timeout, action=action, job_id=job_id)

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
        ``max_age`` seconds, so the load on the dashboard does not grow with the number of watched jobs. A job missing
        from the list (submitted since) is asked for on its own.

        :param job_id: the submission id (or Ray job id).
        :param max_age: seconds a fetched list may be reused.
        """
        endpoint = await self.aget_endpoint()
        poll = _shared_poll((endpoint.url, endpoint.credentials_key))
        async with poll.lock:
            if time.monotonic() - poll.fetched_at >= max_age:
                try:
                    jobs = await _get_json(endpoint, "/api/jobs/", timeout=self.request_timeout, action="list jobs")
                    index: dict[str, dict[str, Any]] = {}
                    for raw in jobs:
                        listed = job_to_dict(raw)
                        for key in (listed["job_id"], listed["submission_id"]):
                            if key:
                                index[key] = listed
                    poll.jobs, poll.error = index, None
                except AirflowTuneException as exc:
                    # Remember the failure too, so a dead dashboard is not asked once per caller.
                    poll.error = exc
                poll.fetched_at = time.monotonic()
            error, job = poll.error, poll.jobs.get(job_id)
        if error is not None:
            raise type(error)(str(error)) from error
        if job is not None:
            return dict(job)
        try:
            return await self.async_get_job_info(job_id)
        except RayJobNotFoundError:
            return None
