"""How the trigger and the blocking wait treat an unreachable dashboard, on a fake clock: unreachability counts from
the dashboard's last answer, a blip shorter than ``max_unreachable_s`` is ridden out, a longer one fails clearly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from airflow_tune.exceptions import RayConnectionError
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.triggers import tune as trigger_module
from airflow_tune.triggers.tune import RayTuneTrigger
from airflow_tune.utils import waiting as waiting_module


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self.now += seconds


class Dashboard:
    """Answers with ``statuses`` in turn; ``None`` stands for a request that failed after ``timeout`` seconds."""

    def __init__(self, clock: Clock, answers: list[str | None], timeout: float = 60.0) -> None:
        self.clock, self.answers, self.timeout = clock, list(answers), timeout

    @contextlib.asynccontextmanager
    async def async_session(self) -> AsyncIterator[Dashboard]:
        yield self

    @contextlib.asynccontextmanager
    async def watch_job(self, job_id: str) -> AsyncIterator[Dashboard]:
        yield self

    async def status(self) -> dict[str, Any]:
        return self.next()

    async def changed(self, timeout: float) -> bool:
        self.clock.now += 5.0  # the next shared poll that brings news
        return True

    def next(self) -> dict[str, Any]:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is None:
            self.clock.now += self.timeout
            raise RayConnectionError("Cannot reach the Ray dashboard: read timeout")
        return {"status": answer, "message": None}

    async def async_job_status(self, job_id: str, max_age: float) -> dict[str, Any]:
        return self.next()

    def get_job_info(self, job_id: str) -> dict[str, Any]:
        return self.next()

    def get_job_logs(self, job_id: str) -> str:
        return ""

    async def async_get_job_logs(self, job_id: str) -> str:
        return ""


def _run_trigger(monkeypatch, clock: Clock, dashboard: Dashboard, **kwargs: Any) -> tuple[dict, list[str]]:
    monkeypatch.setattr(waiting_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(trigger_module.asyncio, "sleep", clock.asleep)
    trigger = RayTuneTrigger(job_id="j", poll_interval=5.0, log_progress=False, **kwargs)
    monkeypatch.setattr(trigger, "_hook", lambda: dashboard)
    warnings: list[str] = []
    monkeypatch.setattr(trigger.log, "warning", lambda msg, *args: warnings.append(msg % args))

    async def first_event() -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    return asyncio.run(first_event()), warnings


def test_the_trigger_counts_unreachability_from_the_last_answer(monkeypatch):
    clock = Clock()
    dashboard = Dashboard(clock, ["RUNNING", None, None, "SUCCEEDED"])
    event, warnings = _run_trigger(monkeypatch, clock, dashboard, max_unreachable_s=300)
    assert event["status"] == "SUCCEEDED"
    # The first failed request took its 60 s read timeout: that is 60 s without an answer, not 0.
    assert warnings[0].startswith("Ray dashboard unreachable for 65s"), warnings
    assert warnings[1].startswith("Ray dashboard unreachable for 130s"), warnings


def test_the_trigger_gives_up_after_max_unreachable_s_with_the_time_it_waited(monkeypatch):
    clock = Clock()
    dashboard = Dashboard(clock, ["RUNNING", None])
    event, _ = _run_trigger(monkeypatch, clock, dashboard, max_unreachable_s=120)
    assert event["status"] == "error"
    assert event["message"].startswith("the Ray dashboard was unreachable for 130s"), event


def _operator(**kwargs: Any) -> RayTuneOperator:
    return RayTuneOperator(
        task_id="t", trainable="p.m:f", storage_path="s3://bkt/e", metric="m", mode="min", poll_interval=5.0, **kwargs
    )


@pytest.fixture(autouse=True)
def _no_progress_reads(monkeypatch):
    """S3 is not the subject here: the blocking wait's progress reads do nothing."""
    from airflow_tune.utils import reconcile

    monkeypatch.setattr(reconcile, "print_progress", lambda follower, log: None)


def test_the_blocking_wait_rides_out_an_unreachable_dashboard(monkeypatch):
    from airflow_tune.operators import tune_wait as operator_module

    clock = Clock()
    monkeypatch.setattr(operator_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(operator_module.time, "sleep", clock.sleep)
    op = _operator(max_unreachable_s=200)
    op.__dict__["hook"] = Dashboard(clock, ["RUNNING", None, None, "RUNNING", None, "SUCCEEDED"])
    assert op.wait_blocking("j", "s3://bkt/e") == "SUCCEEDED"


def test_the_blocking_wait_fails_clearly_after_max_unreachable_s(monkeypatch):
    from airflow_tune.operators import tune_wait as operator_module

    clock = Clock()
    monkeypatch.setattr(operator_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(operator_module.time, "sleep", clock.sleep)
    op = _operator(max_unreachable_s=100)
    op.__dict__["hook"] = Dashboard(clock, ["RUNNING", None])
    with pytest.raises(RayConnectionError, match=r"unreachable for 130s while waiting for job j"):
        op.wait_blocking("j", "s3://bkt/e")


class Answers(Dashboard):
    """A dashboard whose answers are whole job infos (or None for a failed request), and which records stops."""

    def __init__(self, clock: Clock, answers: list[dict[str, Any] | None]) -> None:
        super().__init__(clock, [])
        self.infos = list(answers)
        self.stopped: list[str] = []

    def next(self) -> dict[str, Any]:
        info = self.infos.pop(0) if len(self.infos) > 1 else self.infos[0]
        if info is None:
            self.clock.now += self.timeout
            raise RayConnectionError("Cannot reach the Ray dashboard: read timeout")
        return info

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True

    async def aget_endpoint(self) -> None:
        return None


def _blocking_outcome(monkeypatch, clock: Clock, dashboard: Answers, **kwargs: Any) -> tuple[str, str | None]:
    """The blocking wait's end as the trigger's event would name it (its exceptions mapped to event statuses)."""
    from airflow_tune.exceptions import RayJobError, RayJobNotFoundError

    monkeypatch.setattr(waiting_module.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(waiting_module.time, "sleep", clock.sleep)
    op = _operator(**kwargs)
    op.__dict__["hook"] = dashboard
    try:
        return op.wait_blocking("j", "s3://bkt/e"), None
    except RayConnectionError as exc:
        return "error", str(exc)
    except RayJobNotFoundError as exc:
        return "error", str(exc)
    except RayJobError as exc:
        return "pending_timeout", str(exc)


PENDING_SINCE_START = {"status": "PENDING", "start_time": 1000.0 * 1000, "message": "installing"}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        pytest.param([{"status": "RUNNING"}, {"status": "SUCCEEDED"}], "SUCCEEDED", id="succeeded"),
        pytest.param([{"status": "RUNNING"}, {"status": "STOPPED", "message": "x"}], "STOPPED", id="stopped"),
        pytest.param([{"status": "RUNNING"}, None, None, {"status": "FAILED"}], "FAILED", id="blip-then-failed"),
        pytest.param([{"status": "RUNNING"}, None], "error", id="unreachable-too-long"),
        pytest.param([PENDING_SINCE_START], "pending_timeout", id="pending-too-long"),
    ],
)
def test_the_blocking_wait_and_the_trigger_decide_alike(monkeypatch, answers, expected):
    """One decision per poll (utils/waiting.JobWait) for both waits: the same answers end both the same way, and a
    job PENDING too long is stopped by both."""
    settings = {"max_unreachable_s": 150, "pending_timeout_s": 30}
    clock = Clock()
    monkeypatch.setattr(waiting_module.time, "time", clock.monotonic)
    blocking_dashboard = Answers(clock, answers)
    blocking, _ = _blocking_outcome(monkeypatch, clock, blocking_dashboard, **settings)

    clock.now = 1000.0
    deferred_dashboard = Answers(clock, answers)
    monkeypatch.setattr(RayTuneTrigger, "_stop", lambda self, hook: _stopped(hook, self.job_id))
    event, _ = _run_trigger(monkeypatch, clock, deferred_dashboard, **settings)
    assert blocking == event["status"] == expected
    stops = ["j"] if expected == "pending_timeout" else []
    assert blocking_dashboard.stopped == deferred_dashboard.stopped == stops


async def _stopped(hook: Answers, job_id: str) -> None:
    hook.stop_job(job_id)
