"""Retries, kills and timeouts of RayTuneOperator against the real local Ray head and S3 endpoint.

Every try of a task instance works on one experiment (named from dag, task, map index and run id): a try whose process
died reattaches to the live Ray job; a try after the job was stopped submits a job that restores the experiment, and
trials that had finished do not run again (the trainable writes marker files into a local folder: the cluster is
this machine).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from airflow_tune.exceptions import RayJobError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.triggers.tune import RayTuneTrigger
from tests.e2e.helpers import (
    experiment,
    jobs_of,
    kill_dag_process,
    load_dag,
    retry_run,
    run_dag,
    run_id_for,
    start_dag_process,
    stop_live_jobs,
    wait_for,
)
from tests.support.tune_testkit.markers import read_markers as read_marks

pytestmark = pytest.mark.usefixtures("stack")

TESTKIT = str(Path(__file__).resolve().parents[1] / "support" / "tune_testkit")
# x=1 finishes after one step; x=3 runs for 8 steps of 1 s: the experiment is stopped with one trial done.
SPLIT_SPACE = {"x": {"grid_search": [1, 3]}, "steps": {"1": 1, "3": 8}, "sleep": 1.0}


def _unique_date() -> datetime:
    return datetime(2002, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _counts(marker_dir: Path, event: str) -> Counter:
    return Counter(m["x"] for m in read_marks(str(marker_dir), event))


def _live(name: str) -> list[dict]:
    return [j for j in jobs_of(name) if j["status"] in ("PENDING", "RUNNING")]


def _one_trial_done_other_running(marker_dir: Path) -> bool:
    return _counts(marker_dir, "end")[1] == 1 and _counts(marker_dir, "step")[3] >= 1


def _assert_resumed_without_rerunning_finished_trials(marker_dir: Path) -> None:
    starts, ends, resumes = (_counts(marker_dir, e) for e in ("start", "end", "resume"))
    assert starts == {1: 1, 3: 1}, starts  # no trial started from scratch twice
    assert ends == {1: 1, 3: 1}, ends  # the finished trial x=1 did not run again
    assert resumes[3] == 1 and resumes[1] == 0, resumes  # x=3 resumed from its checkpoint


@pytest.mark.timeout(180)
def test_a_killed_task_process_is_followed_by_a_try_that_reattaches_to_the_live_job(tmp_path):
    logical_date = _unique_date()
    name = experiment("aft_retry", run_id_for(logical_date))
    space = {"x": {"grid_search": [1, 3]}, "steps": 6, "sleep": 1.0, "marker_dir": str(tmp_path / "marks")}
    proc = start_dag_process("aft_retry", logical_date, {"space": space}, tmp_path / "try1.log")
    try:
        wait_for(lambda: _live(name), 90, "the first try's Ray job")
        wait_for(lambda: read_marks(space["marker_dir"], "step"), 60, "a reported step")
        os.killpg(proc.pid, signal.SIGKILL)  # the worker dies: no on_kill, no cleanup
        proc.wait(timeout=30)
    finally:
        kill_dag_process(proc)
    [job] = jobs_of(name)
    assert job["status"] == "RUNNING", "killing the Airflow task must not stop the experiment"

    # The scheduler's retry of the dead worker's task, in the same run (Airflow keeps its record of the job there).
    run = retry_run(load_dag("aft_retry"), logical_date)
    assert run.run_id == run_id_for(logical_date) and run.try_numbers() == {"tune": 2}
    assert run.state == "success", (run.task_states(), run.errors("tune"))
    result = run.xcom("tune")
    assert set(result) == set(RESULT_KEYS)
    [after] = jobs_of(name)  # exactly one Ray job ever ran this experiment
    assert after["submission_id"] == job["submission_id"] == result["job_id"]
    assert after["status"] == "SUCCEEDED"
    assert result["num_terminated"] == 2 and result["best_config"]["x"] == 3
    assert _counts(tmp_path / "marks", "start") == {1: 1, 3: 1}
    assert _counts(tmp_path / "marks", "end") == {1: 1, 3: 1}


@pytest.mark.timeout(180)
def test_a_try_after_the_job_was_stopped_restores_the_experiment_without_rerunning_finished_trials(tmp_path):
    logical_date = _unique_date()
    name = experiment("aft_retry", run_id_for(logical_date))
    marks = tmp_path / "marks"
    stopped: list[str] = []

    def stop_mid_experiment() -> None:
        wait_for(lambda: _one_trial_done_other_running(marks), 90, "one trial done, one running")
        [job] = _live(name)
        RayHook().stop_job(job["submission_id"])
        stopped.append(job["submission_id"])

    stopper = threading.Thread(target=stop_mid_experiment, daemon=True)
    stopper.start()
    run = run_dag(load_dag("aft_retry"), {"space": {**SPLIT_SPACE, "marker_dir": str(marks)}}, logical_date)
    stopper.join(timeout=5)
    assert stopped, "the experiment finished before it could be stopped"
    assert run.state == "success", (run.task_states(), run.errors("tune"))
    assert run.try_numbers() == {"tune": 2}
    [first_error] = run.errors("tune")
    assert isinstance(first_error, RayJobError) and "STOPPED" in str(first_error)
    # Stopped by Ray's client, not by the task: the failure says so first (issue 32).
    assert str(first_error).startswith(f"Ray job {stopped[0]} was stopped from outside this task"), first_error
    newest, oldest = jobs_of(name)
    assert oldest["submission_id"] == stopped[0] and oldest["status"] == "STOPPED"
    assert newest["status"] == "SUCCEEDED"
    result = run.xcom("tune")
    assert result["job_id"] == newest["submission_id"]
    assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["best_config"]["x"] == 3
    _assert_resumed_without_rerunning_finished_trials(marks)


@pytest.mark.timeout(200)
def test_sigterm_to_the_task_process_stops_the_job_with_state_saved_and_the_next_try_resumes(tmp_path):
    """Airflow's task runner calls on_kill on SIGTERM (what a 'mark failed' or a worker shutdown sends)."""
    logical_date = _unique_date()
    name = experiment("aft_retry", run_id_for(logical_date))
    marks = tmp_path / "marks"
    log = tmp_path / "dag_run.log"
    proc = start_dag_process("aft_retry", logical_date, {"space": {**SPLIT_SPACE, "marker_dir": str(marks)}}, log)
    try:
        wait_for(lambda: _one_trial_done_other_running(marks), 120, "one trial done, one running")
        [job] = _live(name)
        os.kill(proc.pid, signal.SIGTERM)
        sent = time.monotonic()
        hook = RayHook()
        wait_for(lambda: hook.get_job_status(job["submission_id"]) == "STOPPED", 30, "the job to stop")
        stop_seconds = time.monotonic() - sent
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        kill_dag_process(proc)
    print(f"the job stopped {stop_seconds:.1f}s after SIGTERM reached the task process")
    job_log = hook.get_job_logs(job["submission_id"])
    assert "state saved" in job_log, job_log[-2000:]
    text = log.read_text()
    assert f"Stopping Ray job {job['submission_id']}" in text
    assert 'DAG_RUN_STATE success {"tune": "success"}' in text
    newest, oldest = jobs_of(name)
    assert oldest["submission_id"] == job["submission_id"] and newest["status"] == "SUCCEEDED"
    _assert_resumed_without_rerunning_finished_trials(marks)


def _no_xcom(key: str, value: object) -> None:
    pass


@pytest.mark.timeout(120)
def test_trigger_on_kill_stops_a_live_job_and_the_trigger_then_reports_it_stopped(tmp_path):
    marks = tmp_path / "marks"
    op = RayTuneOperator(
        task_id="tune",
        trainable="tune_testkit.airflow_cases:stepper",
        storage_path=os.environ["AIRFLOW_TUNE_STORAGE_URI"],
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [1, 3]}, "steps": 20, "sleep": 1.0, "marker_dir": str(marks)},
        py_modules=[TESTKIT],
        progress_interval_s=1.0,
        stop_wait_s=30,
    )
    ti = SimpleNamespace(dag_id="aft_trigger_kill", task_id="tune", map_index=-1, try_number=1, xcom_push=_no_xcom)
    context = {"ti": ti, "run_id": f"manual__{uuid.uuid4().hex}"}
    spec = op.build_spec(context)  # type: ignore[arg-type]
    job_id, finished = op.resume_or_submit(context, spec)  # type: ignore[arg-type]
    assert finished is None and job_id
    trigger = RayTuneTrigger(job_id=job_id, poll_interval=0.5, experiment_uri=spec.experiment_uri)

    async def scenario() -> tuple[dict, float]:
        watching = asyncio.create_task(trigger.run().__anext__())
        while not read_marks(str(marks), "step"):
            assert not watching.done(), watching.result().payload
            await asyncio.sleep(0.25)
        assert not watching.done()
        started = time.monotonic()
        await trigger.on_kill()
        event = await asyncio.wait_for(watching, timeout=45)
        return event.payload, time.monotonic() - started

    try:
        payload, seconds = asyncio.run(scenario())
    finally:
        stop_live_jobs(spec.name)
    assert payload["status"] == "STOPPED" and payload["job_id"] == job_id
    print(f"the job stopped {seconds:.1f}s after on_kill")
    assert "state saved" in RayHook().get_job_logs(job_id)
    assert _counts(marks, "end") == {}  # stopped mid-experiment


# Airflow's execution_timeout uses SIGALRM, as does the signal method of pytest-timeout.
@pytest.mark.timeout(150, method="thread")
@pytest.mark.parametrize("mode", ["blocking", "deferred"])
def test_execution_timeout_fails_the_task_and_leaves_no_running_job(tmp_path, mode):
    dag_id = f"aft_timeout_{mode}"
    space = {"x": {"grid_search": [1, 3]}, "steps": 60, "sleep": 1.0, "marker_dir": str(tmp_path)}
    logical_date = _unique_date()
    name = experiment(dag_id, run_id_for(logical_date))
    try:
        run = run_dag(load_dag(dag_id), {"space": space}, logical_date)
        assert run.state == "failed"
        [error] = run.errors("tune")
        if mode == "blocking":
            assert type(error).__name__ == "AirflowTaskTimeout"
        else:
            assert isinstance(error, RayJobError) and "execution_timeout" in str(error)
        [job] = jobs_of(name)
        # Ray waits up to stop_wait_s (60 s by default) for Tune to save its state, then kills the driver.
        wait_for(lambda: not _live(name), 90, "the job to end")
        assert jobs_of(name)[0]["status"] == "STOPPED"
        if read_marks(str(tmp_path), "start"):
            # The experiment had begun (on a loaded machine the stop can come while the driver still imports Ray).
            log = RayHook().get_job_logs(job["submission_id"])
            assert "state saved" in log, log[-6000:]
    finally:
        stop_live_jobs(name)
