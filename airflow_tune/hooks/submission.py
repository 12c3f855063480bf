"""Submitting a job exactly once.

A submission no job agent took (none had registered yet) is sent again (see :func:`~airflow_tune.hooks.transport.
submit_retrying`). A submission whose answer was lost (the connection dropped, the read timed out or the dashboard
answered 5xx) may have created the job anyway: Ray's job agent creates it, not the dashboard, and a dashboard that
restarts its job module under load drops the answers in flight. So the job is looked up by its submission id before
anything is sent again: one submission never becomes two jobs, nor none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_tune.exceptions import RayDashboardUnavailable, RayJobError, RayJobNotFoundError
from airflow_tune.hooks.transport import nothing_submitted, retrying, submit_retrying

if TYPE_CHECKING:
    from airflow_tune.hooks.jobs_client import JobsClient

#: How long a dashboard that lost an answer is waited for before the submission fails (a restarting job module of
#: Ray's dashboard takes up to its 30 s start timeout).
SETTLE_SECONDS = 60.0


def submit_once(client: JobsClient, fields: Mapping[str, Any], log: Any) -> str:
    """Submit ``fields`` and return the submission id of the one job they made.

    :param client: the Jobs API client.
    :param fields: the keyword arguments of :meth:`~airflow_tune.hooks.jobs_client.JobsClient.submit_job`.
    :param log: where a new try is said.
    """

    def again(_: object) -> None:
        log.info("No Ray job agent has registered yet (a new head?): submitting %s again", fields["submission_id"])

    submit = submit_retrying(before_sleep=again)
    try:
        return submit(client.submit_job, **fields)
    except RayDashboardUnavailable as exc:
        if nothing_submitted(exc):
            raise
        return settle_lost_submission(client, fields, exc, submit, log)


def same_submission(job: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    """Whether ``job`` (as the Jobs API describes it) is the one ``fields`` submit: same entrypoint, same metadata.

    :param job: the job found under the submission id.
    :param fields: what was sent (the keyword arguments of :meth:`JobsClient.submit_job`).
    """
    return job.get("entrypoint") == fields.get("entrypoint") and dict(job.get("metadata") or {}) == dict(
        fields.get("metadata") or {}
    )


def settle_lost_submission(
    client: JobsClient,
    fields: Mapping[str, Any],
    lost: RayDashboardUnavailable,
    submit: Callable[..., str],
    log: Any,
) -> str:
    """Return the submission id once the job surely exists, created by this submission (found, or sent again).

    :param client: the Jobs API client the submission went through.
    :param fields: what was sent.
    :param lost: the failure that lost the answer (kept as the cause when the dashboard does not come back).
    :param submit: sends ``fields`` again (with the caller's own retries).
    :param log: where each step is said.
    """
    submission_id = str(fields["submission_id"])
    log.warning("The answer to submitting Ray job %s was lost (%s): looking for the job by its id", submission_id, lost)
    job = _job_if_any(client, submission_id, lost)
    if job is None:
        log.info("Ray has no job %s: submitting it again", submission_id)
        try:
            return submit(client.submit_job, **fields)
        except RayJobError as exc:
            if "already exists" not in str(exc):
                raise
            # The first request was still on its way to the job agent when Ray was asked.
            job = _job_if_any(client, submission_id, lost)
            if job is None:
                raise
    if not same_submission(job, fields):
        raise RayJobError(
            f"Ray job {submission_id!r} already exists on {client.address} and is not this submission (another "
            "entrypoint or metadata): use another submission id."
        )
    log.info("Ray job %s was created by the submission whose answer was lost", submission_id)
    return submission_id


def _job_if_any(client: JobsClient, submission_id: str, lost: RayDashboardUnavailable) -> dict[str, Any] | None:
    try:
        for attempt in retrying(within=SETTLE_SECONDS):
            with attempt:
                try:
                    return client.get_job_info(submission_id)
                except RayJobNotFoundError:
                    return None
    except RayDashboardUnavailable as exc:
        raise RayDashboardUnavailable(
            f"{lost} The dashboard did not answer again within {SETTLE_SECONDS:.0f}s to say whether Ray job "
            f"{submission_id!r} was created: look for it before submitting it again. ({exc})"
        ) from lost
    raise AssertionError("unreachable: tenacity reraises the last error")  # pragma: no cover
