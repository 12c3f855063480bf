"""A job that stays PENDING (here: its driver asks for 64 CPUs, so no node can start it) makes the wait fail after
``pending_timeout_s``, saying so, and asks Ray to stop it, in the blocking wait and in the trigger, instead of holding
the task until its execution_timeout. (Ray itself cannot stop a job whose driver never started: it fails such a job
after RAY_JOB_START_TIMEOUT_SECONDS.)"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.triggers.tune import RayTuneTrigger

pytestmark = [pytest.mark.usefixtures("stack"), pytest.mark.timeout(120)]


def _stuck_job() -> str:
    job_id = f"stuck-{uuid.uuid4().hex[:8]}"
    RayHook().submit_job(entrypoint="python -c 'print(1)'", submission_id=job_id, entrypoint_num_cpus=64)
    return job_id


class StopRecordingHook(RayHook):
    stopped: list[str] = []

    def stop_job(self, job_id: str) -> bool:
        type(self).stopped.append(job_id)
        return super().stop_job(job_id)


def test_the_blocking_wait_stops_a_job_that_stays_pending():
    job_id = _stuck_job()
    op = RayTuneOperator(
        task_id="t", trainable="m:f", storage_path="s3://bkt/e", metric="m", mode="min", pending_timeout_s=5
    )
    op.__dict__["hook"] = StopRecordingHook()
    with pytest.raises(RayJobError, match=rf"Ray job {job_id} stayed PENDING for \d+s \(pending_timeout_s=5\)"):
        op.wait_blocking(job_id, "s3://airflow-tune/experiments/none")
    assert StopRecordingHook.stopped[-1] == job_id


def test_the_trigger_stops_a_job_that_stays_pending():
    job_id = _stuck_job()

    trigger = RayTuneTrigger(job_id=job_id, pending_timeout_s=5, poll_interval=1.0)
    trigger._hook = StopRecordingHook  # type: ignore[method-assign]

    async def first_event() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    event = asyncio.run(first_event())
    assert event["status"] == "pending_timeout" and f"Ray job {job_id} stayed PENDING" in event["message"]
    assert StopRecordingHook.stopped[-1] == job_id
