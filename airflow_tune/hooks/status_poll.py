"""One job list per dashboard and interval, shared by every trigger in the triggerer's event loop.

A triggerer watching a thousand experiments on one cluster asks the dashboard for ``GET /api/jobs/`` once per
``max_age``, not once per experiment; a dead dashboard is remembered as such for the same time, so it is not asked
once per trigger either.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_tune.exceptions import AirflowTuneException
from airflow_tune.hooks.transport import AsyncTransport, job_to_dict


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


async def list_jobs_by_id(transport: AsyncTransport) -> dict[str, dict[str, Any]]:
    """The dashboard's jobs, by submission id and by Ray job id."""
    index: dict[str, dict[str, Any]] = {}
    for raw in await transport.get_json("/api/jobs/", action="list jobs"):
        listed = job_to_dict(raw)
        for key in (listed["job_id"], listed["submission_id"]):
            if key:
                index[key] = listed
    return index


async def shared_job_status(transport: AsyncTransport, job_id: str, max_age: float) -> dict[str, Any] | None:
    """A job's details from the job list shared by every caller watching the same dashboard with the same
    credentials; None when the list does not have it (the caller asks for that job alone).

    :param transport: the caller's transport; it fetches the list when the shared one is older than ``max_age``.
    :param job_id: the submission id (or Ray job id).
    :param max_age: seconds a fetched list may be reused.
    """
    endpoint = transport.endpoint
    poll = _shared_poll((endpoint.url, endpoint.credentials_key))
    async with poll.lock:
        if time.monotonic() - poll.fetched_at >= max_age:
            try:
                poll.jobs, poll.error = await list_jobs_by_id(transport), None
            except AirflowTuneException as exc:
                # Remember the failure too, so a dead dashboard is not asked once per caller.
                poll.error = exc
            poll.fetched_at = time.monotonic()
        error, job = poll.error, poll.jobs.get(job_id)
    if error is not None:
        raise type(error)(str(error)) from error
    return dict(job) if job is not None else None


# -- watching jobs: one background poll per dashboard, waking only the watchers whose job changed ----------------------

#: How often the one shared poll of a dashboard lists its jobs while anyone watches: the latency with which a trigger
#: sees its job end, at two requests per second per dashboard, whatever the number of triggers.
STATUS_INTERVAL_ENV = "AIRFLOW_TUNE_STATUS_INTERVAL_S"
DEFAULT_STATUS_INTERVAL = 0.5


def status_interval() -> float:
    import os

    try:
        return max(0.1, float(os.environ.get(STATUS_INTERVAL_ENV, DEFAULT_STATUS_INTERVAL)))
    except ValueError:
        return DEFAULT_STATUS_INTERVAL


class _Watch:
    """The job list of one dashboard, fetched every ``interval`` by one task while anyone watches a job on it."""

    def __init__(self, endpoint: Any, timeout: float, interval: float) -> None:
        self.endpoint, self.timeout, self.interval = endpoint, timeout, interval
        self.loop = asyncio.get_running_loop()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.error: AirflowTuneException | None = None
        self.fetched = asyncio.Event()
        self.watchers: dict[str, set[asyncio.Event]] = {}
        self.task: asyncio.Task[None] | None = None

    def subscribe(self, job_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self.watchers.setdefault(job_id, set()).add(event)
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._run(), name=f"airflow-tune status poll {self.endpoint.url}")
        return event

    def unsubscribe(self, job_id: str, event: asyncio.Event) -> None:
        events = self.watchers.get(job_id, set())
        events.discard(event)
        if not events:
            self.watchers.pop(job_id, None)
        if not self.watchers and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _run(self) -> None:
        async with AsyncTransport(self.endpoint, self.timeout) as transport:
            while self.watchers:
                before, failing_before = self.jobs, self.error is not None
                try:
                    self.jobs, self.error = await list_jobs_by_id(transport), None
                except AirflowTuneException as exc:
                    self.error = exc
                self.fetched.set()
                # Wake a watcher when its job's status changed, or when the dashboard starts or stops failing.
                failing_changed = failing_before != (self.error is not None)
                for job_id, events in list(self.watchers.items()):
                    old, new = before.get(job_id), self.jobs.get(job_id)
                    if failing_changed or (old or {}).get("status") != (new or {}).get("status"):
                        for event in events:
                            event.set()
                await asyncio.sleep(self.interval)


_WATCHES: dict[tuple[str, str], _Watch] = {}


def _watch_for(endpoint: Any, timeout: float) -> _Watch:
    key = (endpoint.url, endpoint.credentials_key)
    watch = _WATCHES.get(key)
    # A watch belongs to one event loop; a new loop (a test, a restarted triggerer) gets its own.
    if watch is None or watch.loop is not asyncio.get_running_loop():
        watch = _WATCHES[key] = _Watch(endpoint, timeout, status_interval())
    return watch


class JobWatch:
    """One job seen through its dashboard's shared poll; see :meth:`RayHook.watch_job`."""

    def __init__(self, watch: _Watch, job_id: str, event: asyncio.Event) -> None:
        self._watch, self.job_id, self._event = watch, job_id, event

    async def status(self) -> dict[str, Any] | None:
        """The job's details from the latest shared list (None when the list does not have it); raises the
        package's exception when the last list request failed."""
        await self._watch.fetched.wait()
        if self._watch.error is not None:
            error = self._watch.error
            raise type(error)(str(error)) from error
        job = self._watch.jobs.get(self.job_id)
        return dict(job) if job is not None else None

    async def changed(self, timeout: float) -> bool:
        """Wait until the job's status changes (or a list request fails), at most ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(timeout, 0.0))
        except asyncio.TimeoutError:
            return False
        self._event.clear()
        return True

    def close(self) -> None:
        self._watch.unsubscribe(self.job_id, self._event)


def watch(endpoint: Any, timeout: float, job_id: str) -> JobWatch:
    shared = _watch_for(endpoint, timeout)
    return JobWatch(shared, job_id, shared.subscribe(job_id))
