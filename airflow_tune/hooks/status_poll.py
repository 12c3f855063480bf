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
                jobs = await transport.get_json("/api/jobs/", action="list jobs")
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
    return dict(job) if job is not None else None
