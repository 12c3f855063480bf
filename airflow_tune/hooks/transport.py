"""How the hook talks to the Jobs API: the wire format of jobs, errors translated into the package's exceptions,
retries, and an async transport (one aiohttp session per run, bounded retries); the sync client is
:mod:`~airflow_tune.hooks.jobs_client`.

Only idempotent calls are retried (reading a job, its logs, the job list), with tenacity's exponential backoff, and
only on failures that may pass (no connection, a timeout, HTTP 5xx/429): a refused token or a missing job is final.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from airflow_tune.exceptions import (
    AirflowTuneException,
    RayConnectionError,
    RayDashboardUnavailable,
    RayJobError,
    RayJobNotFoundError,
)
from airflow_tune.hooks.connection import RayEndpoint, stringify_metadata

if TYPE_CHECKING:
    import ssl

    import aiohttp

CONNECT_TIMEOUT = 10.0
#: Tries of an idempotent call (the first and two retries), backing off from 0.5 s up to 4 s with jitter.
ATTEMPTS = 3


def _policy(attempts: int, within: float | None = None) -> dict[str, Any]:
    return {
        "stop": stop_after_attempt(attempts) if within is None else stop_after_delay(within),
        "wait": wait_exponential_jitter(multiplier=0.5, max=4.0, jitter=0.5),
        "retry": retry_if_exception_type(RayDashboardUnavailable),
        "reraise": True,
    }


def retrying(attempts: int = ATTEMPTS, *, within: float | None = None) -> Retrying:
    """Tenacity's loop for an idempotent sync call: ``for attempt in retrying(): with attempt: ...``.

    :param attempts: tries in all.
    :param within: seconds to keep trying instead (a caller that must wait out a restarting dashboard).
    """
    return Retrying(**_policy(attempts, within))


#: Ray's answer to a submission while no job agent has registered yet (a head just started or restarted): the
#: dashboard waited 10 s for one and handed the job to nobody, so submitting again cannot start it twice.
NO_AGENT_YET = "No available agent to submit job"
#: Tries of a submission that no agent took (each waits up to Ray's 10 s for one).
SUBMIT_ATTEMPTS = 4


def nothing_submitted(exc: BaseException) -> bool:
    """Whether a failed submission provably reached no job agent (so it may be sent again)."""
    return isinstance(exc, RayDashboardUnavailable) and NO_AGENT_YET in str(exc)


def submit_retrying(before_sleep: Callable[[Any], None] | None = None) -> Retrying:
    """Tenacity's retrier for a submission: sent again only when :func:`nothing_submitted` (a submission is not
    idempotent otherwise: a lost answer may hide a started job).

    :param before_sleep: called before each new try (to say so in the task log).
    """
    return Retrying(
        stop=stop_after_attempt(SUBMIT_ATTEMPTS),
        wait=wait_exponential_jitter(multiplier=0.5, max=4.0, jitter=0.5),
        retry=retry_if_exception(nothing_submitted),
        reraise=True,
        before_sleep=before_sleep,
    )


def async_retrying(attempts: int = ATTEMPTS) -> AsyncRetrying:
    """:func:`retrying` for coroutines (tenacity sleeps with ``asyncio.sleep``: the loop is never blocked)."""
    return AsyncRetrying(**_policy(attempts))


# -- the wire format of jobs ----------------------------------------------------------------------------------------
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


# -- errors ---------------------------------------------------------------------------------------------------------

_STATUS_RE = re.compile(r"status code (\d{3})")


def status_error(status: int, body: str, *, url: str, action: str, job_id: str | None) -> AirflowTuneException:
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
    if status >= 500 or status == 429:
        return RayDashboardUnavailable(f"The Ray Jobs API at {url} failed to {action} (HTTP {status}): {body}")
    return RayJobError(f"The Ray Jobs API at {url} failed to {action} (HTTP {status}): {body}")


def translate_error(exc: Exception, *, url: str, action: str, job_id: str | None = None) -> AirflowTuneException:
    """Translate an exception of ``requests`` (or of Ray's client, which ships local code)."""
    if isinstance(exc, AirflowTuneException):
        return exc
    text = str(exc)
    if type(exc).__name__ == "AuthenticationError":
        status = 403 if "failed" in text.lower() else 401
        return status_error(status, "", url=url, action=action, job_id=job_id)
    if isinstance(exc, OSError):  # ConnectionError, requests' ConnectionError/Timeout, a missing CA bundle
        return RayDashboardUnavailable(f"Cannot reach the Ray dashboard at {url} to {action}: {text}")
    match = _STATUS_RE.search(text)
    if match:
        return status_error(int(match.group(1)), text, url=url, action=action, job_id=job_id)
    return RayJobError(f"The Ray Jobs API at {url} failed to {action}: {type(exc).__name__}: {text}")


# -- async -------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _ssl_context(cafile_or_dir: str) -> ssl.SSLContext:
    import ssl

    if os.path.isdir(cafile_or_dir):
        return ssl.create_default_context(capath=cafile_or_dir)
    return ssl.create_default_context(cafile=cafile_or_dir)


async def ssl_argument(endpoint: RayEndpoint) -> Any:
    """aiohttp's ``ssl=`` for the endpoint; a CA bundle is read in a thread, once (reading a file blocks the loop)."""
    if endpoint.verify is False:
        return False
    if isinstance(endpoint.verify, str):
        try:
            return await asyncio.to_thread(_ssl_context, endpoint.verify)
        except OSError as exc:
            raise RayConnectionError(f"Cannot load the CA bundle {endpoint.verify!r}: {exc}") from exc
    return True


class AsyncTransport:
    """GETs to one dashboard over one aiohttp session, with bounded retries; use as ``async with``.

    :param endpoint: the dashboard and its credentials.
    :param timeout: total seconds for each request.
    """

    def __init__(self, endpoint: RayEndpoint, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._ssl: Any = True

    async def __aenter__(self) -> AsyncTransport:
        import aiohttp

        self._ssl = await ssl_argument(self.endpoint)
        self._session = aiohttp.ClientSession(
            headers=self.endpoint.headers,
            cookies=self.endpoint.cookies,
            timeout=aiohttp.ClientTimeout(total=self.timeout, connect=CONNECT_TIMEOUT),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_json(self, path: str, *, action: str, job_id: str | None = None) -> Any:
        """GET ``path`` and decode its JSON, retrying what may pass; errors become the package's exceptions.

        :param path: the REST path, starting with ``/``, ids already quoted.
        :param action: what the request is for, for error messages.
        :param job_id: the job asked about, so a 404 reads "not found".
        """
        async for attempt in async_retrying():
            with attempt:
                return await self._get_once(path, action=action, job_id=job_id)
        raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover

    async def _get_once(self, path: str, *, action: str, job_id: str | None) -> Any:
        import aiohttp

        if self._session is None:
            raise RuntimeError("AsyncTransport used outside 'async with'")
        url = self.endpoint.url
        try:
            async with self._session.get(url + path, ssl=self._ssl) as resp:
                if resp.status >= 400:
                    body = await resp.text()
                    raise status_error(resp.status, body, url=url, action=action, job_id=job_id)
                return await resp.json(content_type=None)
        except AirflowTuneException:
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            raise RayDashboardUnavailable(
                f"Cannot reach the Ray dashboard at {url} to {action}: {type(exc).__name__}: {exc}"
            ) from exc
