"""A deferred task killed by its user stops its job on every supported Airflow: 3.3 calls ``on_kill``; 3.1 and 3.2
only cancel the trigger, which then asks the Task SDK for its task's state (pure logic: a fake dashboard and a fake
Task SDK answer; the real triggerers are exercised in tests/compat and tests/e2e)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.execution_time import task_runner
from airflow.sdk.execution_time.comms import TaskStatesResult

from airflow_tune.triggers import tune as trigger_module
from airflow_tune.triggers.tune import RayTuneTrigger
from tests.unit.triggers.test_trigger_and_retries import FakeDashboard


class WaitingDashboard(FakeDashboard):
    """A job that keeps running: the trigger waits for a change that never comes, until it is cancelled."""

    async def changed(self, timeout: float) -> bool:
        self.waits.append(timeout)
        await asyncio.Event().wait()
        return False


def _comms(monkeypatch, answer: Any) -> None:
    """The trigger runner's link to its supervisor: ``asend(GetTaskStates)`` answered by ``answer(**fields)``."""

    class Comms:
        async def asend(self, msg: Any) -> Any:
            fields = {k: getattr(msg, k) for k in ("dag_id", "task_ids", "run_ids", "map_index")}
            states = await asyncio.to_thread(answer, **fields)
            return TaskStatesResult(task_states=states)

    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", Comms(), raising=False)


def _cancel_while_deferred(
    monkeypatch, *, airflow_3_3: bool, states: Any, map_index: int = -1
) -> tuple[list[str], list[dict[str, Any]]]:
    """Run the trigger, cancel it as the triggerer does; return the jobs stopped and the Task SDK's questions."""
    monkeypatch.setattr(trigger_module, "AIRFLOW_V_3_3_PLUS", airflow_3_3)
    asked: list[dict[str, Any]] = []

    def get_task_states(**kwargs: Any) -> Any:
        asked.append(kwargs)
        if isinstance(states, Exception):
            raise states
        return states

    _comms(monkeypatch, get_task_states)
    dashboard = WaitingDashboard(["RUNNING"])
    trigger = RayTuneTrigger(job_id="j", log_progress=False)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="tune", run_id="r", map_index=map_index)
    monkeypatch.setattr(trigger, "_hook", lambda: dashboard)

    async def scenario() -> None:
        run = asyncio.create_task(trigger.run().__anext__())
        while not dashboard.waits:  # deferred: the trigger waits for its job to change
            assert not run.done()
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    asyncio.run(scenario())
    return dashboard.stopped, asked


@pytest.mark.parametrize("state", ["failed", "success", None, "up_for_retry", "scheduled"])
def test_before_3_3_a_cancelled_trigger_whose_task_left_deferred_stops_the_job(monkeypatch, state):
    stopped, asked = _cancel_while_deferred(monkeypatch, airflow_3_3=False, states={"r": {"tune": state}})
    assert stopped == ["j"]
    assert asked == [{"dag_id": "d", "task_ids": ["tune"], "run_ids": ["r"], "map_index": -1}]


def test_before_3_3_a_mapped_tasks_state_is_read_under_its_map_index(monkeypatch):
    stopped, asked = _cancel_while_deferred(
        monkeypatch, airflow_3_3=False, states={"r": {"tune_2": "failed", "tune_1": "deferred"}}, map_index=2
    )
    assert stopped == ["j"] and asked[0]["map_index"] == 2


def test_before_3_3_a_triggerer_restart_or_rebalance_leaves_the_job_running(monkeypatch):
    stopped, _ = _cancel_while_deferred(monkeypatch, airflow_3_3=False, states={"r": {"tune": "deferred"}})
    assert stopped == []


@pytest.mark.parametrize("answer", [ConnectionError("API server unreachable"), {"r": {}}, {}])
def test_before_3_3_an_unknown_state_leaves_the_job_running(monkeypatch, answer):
    stopped, _ = _cancel_while_deferred(monkeypatch, airflow_3_3=False, states=answer)
    assert stopped == []


def test_on_3_3_cancellation_asks_nothing_and_stops_nothing_on_kill_does(monkeypatch):
    stopped, asked = _cancel_while_deferred(monkeypatch, airflow_3_3=True, states={"r": {"tune": "failed"}})
    assert stopped == [] and asked == []  # no double stop: 3.3's triggerer calls on_kill for a user's action


def test_before_3_3_cancels_repeated_while_the_state_is_asked_interrupt_neither_the_question_nor_the_stop(
    monkeypatch,
):
    """3.1/3.2 cancel a removed trigger again at every triggerer loop until it ends."""
    import threading

    monkeypatch.setattr(trigger_module, "AIRFLOW_V_3_3_PLUS", False)
    asked, answer = threading.Event(), threading.Event()

    def slow_get_task_states(**kwargs: Any) -> Any:
        asked.set()
        assert answer.wait(10)
        return {"r": {"tune": "failed"}}

    _comms(monkeypatch, slow_get_task_states)
    dashboard = WaitingDashboard(["RUNNING"])
    trigger = RayTuneTrigger(job_id="j", log_progress=False)
    trigger.task_instance = SimpleNamespace(dag_id="d", task_id="tune", run_id="r", map_index=-1)
    monkeypatch.setattr(trigger, "_hook", lambda: dashboard)

    async def scenario() -> None:
        run = asyncio.create_task(trigger.run().__anext__())
        while not dashboard.waits:
            await asyncio.sleep(0.01)
        run.cancel()
        while not asked.is_set():
            await asyncio.sleep(0.01)
        run.cancel()  # the next loop's cancel, while the question is out
        with pytest.raises(asyncio.CancelledError):
            await run
        assert dashboard.stopped == []
        answer.set()
        for _ in range(500):
            if dashboard.stopped:
                break
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert dashboard.stopped == ["j"]
    assert not trigger_module._AFTER_CANCEL


def test_a_stop_reads_the_connection_on_the_loop_before_the_thread_that_stops_the_job():
    """From a plain thread the Task SDK's sync connection lookup opens a loop of its own and its message interleaves
    with the trigger runner's (3.1 then stops its runner): the hook's endpoint is read on the loop first."""
    import threading

    calls: list[tuple[str, bool]] = []

    class Hook:
        async def aget_endpoint(self) -> None:
            calls.append(("endpoint", threading.current_thread() is threading.main_thread()))

        def stop_job(self, job_id: str) -> bool:
            calls.append(("stop", threading.current_thread() is threading.main_thread()))
            return True

    asyncio.run(RayTuneTrigger(job_id="j", log_progress=False)._stop(Hook()))  # type: ignore[arg-type]
    assert calls == [("endpoint", True), ("stop", False)]
