"""Helpers of the e2e tests: run a DAG with ``dag.test()`` and keep each task try's outcome, read XComs back, find the
Ray jobs of an experiment, wait for a condition."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

DAGS = Path(__file__).resolve().parent / "dags"
RUN_DAG = Path(__file__).resolve().parent / "run_dag.py"


def load_dag(dag_id: str, file: str = "airflow_cases.py") -> Any:
    """The DAG object ``dag_id`` from a file in the DAGs folder (imported once per process)."""
    name = f"aft_e2e_dags_{Path(file).stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, DAGS / file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    for value in vars(module).values():
        if getattr(value, "dag_id", None) == dag_id and hasattr(value, "test"):
            return value
    raise LookupError(f"no DAG {dag_id} in {file}")


class DagTestRun:
    """One ``dag.test()``: the DagRun, and every task try's TaskRunResult (with its exception), by task id."""

    def __init__(self, dag_run: Any, tries: dict[str, list[Any]], seconds: float) -> None:
        self.dag_run = dag_run
        self.tries = tries
        self.seconds = seconds

    @property
    def run_id(self) -> str:
        return str(self.dag_run.run_id)

    @property
    def state(self) -> str:
        return str(self.dag_run.state)

    def task_states(self) -> dict[str, str]:
        from airflow.utils.session import create_session

        with create_session() as session:
            return {ti.task_id: str(ti.state) for ti in self.dag_run.get_task_instances(session=session)}

    def try_numbers(self) -> dict[str, int]:
        from airflow.utils.session import create_session

        with create_session() as session:
            return {ti.task_id: int(ti.try_number) for ti in self.dag_run.get_task_instances(session=session)}

    def errors(self, task_id: str) -> list[BaseException]:
        return [r.error for r in self.tries.get(task_id, []) if r is not None and r.error is not None]

    def xcom(self, task_id: str, key: str = "return_value") -> Any:
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.scalars(
                XComModel.get_many(run_id=self.run_id, dag_ids=self.dag_run.dag_id, task_ids=task_id, key=key)
            ).first()
            return None if row is None else XComModel.deserialize_value(row)


def run_dag(dag: Any, conf: dict[str, Any] | None = None, logical_date: datetime | None = None) -> DagTestRun:
    """``dag.test()``; with a ``logical_date``, ``run_after`` is the same, so the run id is the same every time."""
    import airflow.sdk.definitions.dag as dag_module

    tries: dict[str, list[Any]] = {}
    original = dag_module._run_task

    def recording(*, ti: Any, task: Any, run_triggerer: bool = False) -> Any:
        result = original(ti=ti, task=task, run_triggerer=run_triggerer)
        tries.setdefault(ti.task_id, []).append(result)
        return result

    dag_module._run_task = recording
    started = time.monotonic()
    try:
        kwargs: dict[str, Any] = {"run_conf": conf, "logical_date": logical_date}
        if logical_date is not None:
            kwargs["run_after"] = logical_date
        dag_run = dag.test(**kwargs)
    finally:
        dag_module._run_task = original
    return DagTestRun(dag_run, tries, time.monotonic() - started)


def retry_run(dag: Any, logical_date: datetime) -> DagTestRun:
    """What the scheduler does after a worker died: the run's running task instances are marked ``up_for_retry`` (a
    zombie's), then that same run goes on (``dag.test()``'s loop, whose next try numbers the retry), keeping what
    Airflow keeps across tries (``task_state_store``). ``run_dag`` would replace the run with a new one."""
    import airflow.models.dagrun as dagrun_module
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    def existing_run(*, dag: Any, logical_date: datetime | None, session: Any, **_: Any) -> Any:
        found = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.logical_date == logical_date))
        if found is not None:
            found.dag = dag
        return found

    with create_session() as session:
        dag_run = existing_run(dag=dag, logical_date=logical_date, session=session)
        assert dag_run is not None, f"no run of {dag.dag_id} at {logical_date}"
        for ti in dag_run.get_task_instances(session=session):
            if ti.state == TaskInstanceState.RUNNING:
                ti.state = TaskInstanceState.UP_FOR_RETRY
                ti.end_date = datetime.now(tz=ti.start_date.tzinfo if ti.start_date else None)
    original = dagrun_module.get_or_create_dagrun
    dagrun_module.get_or_create_dagrun = existing_run  # type: ignore[assignment]
    try:
        return run_dag(dag, None, logical_date)
    finally:
        dagrun_module.get_or_create_dagrun = original


def run_id_for(logical_date: datetime) -> str:
    """The run id ``dag.test(logical_date=d, run_after=d)`` gives (a manual run's)."""
    return f"manual__{logical_date.isoformat()}"


def experiment(dag_id: str, run_id: str, task_id: str = "tune") -> str:
    from airflow_tune.common.spec import experiment_name_for

    return experiment_name_for(dag_id, task_id, run_id, -1)


def jobs_of(experiment_name: str) -> list[dict[str, Any]]:
    from airflow_tune.common.contract import METADATA_EXPERIMENT
    from airflow_tune.hooks.ray import RayHook

    return RayHook().find_jobs({METADATA_EXPERIMENT: experiment_name})


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def stop_live_jobs(experiment_name: str) -> None:
    from airflow_tune.hooks.ray import RayHook

    hook = RayHook()
    for job in jobs_of(experiment_name):
        if job["status"] in ("PENDING", "RUNNING"):
            hook.stop_job(job["submission_id"])


def start_dag_process(dag_id: str, logical_date: datetime, conf: dict[str, Any], log: Path) -> subprocess.Popen:
    """``run_dag.py`` in a session of its own (so a test can kill it with all it started), output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(RUN_DAG), dag_id, logical_date.isoformat(), json.dumps(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def kill_dag_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def wait_for_trials(proc: subprocess.Popen, log: Path, marker_dir: str, event: str, timeout: float = 300) -> None:
    """Until a trial of the run in ``proc`` has written an ``event`` marker; fails with the run's log if it exits."""
    from tests.support.tune_testkit.markers import read_markers

    wait_for(lambda: read_markers(marker_dir, event) or proc.poll() is not None, timeout, f"a {event} marker")
    assert proc.poll() is None, log.read_text()[-5000:]


def jobs_of_run(dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """Every Ray job the head knows that any task of this DAG run submitted (mapped ones included)."""
    from airflow_tune.common.contract import METADATA_OWNER
    from airflow_tune.hooks.ray import RayHook

    return RayHook().find_jobs({METADATA_OWNER["dag_id"]: dag_id, "airflow_run_id": run_id})
