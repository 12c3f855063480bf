"""Which Ray jobs a task believes: only those Airflow's record of the task instance each names lists (pure logic:
the task instances' XComs and ``task_state_store`` are dicts here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.exceptions import ExperimentStorageError
from airflow_tune.trust.proofs import proven_progress
from airflow_tune.trust.submitted import RECORD_KEY, SubmittedJobs, record_job, wait_for_record

pytestmark = pytest.mark.unit


class _TI(SimpleNamespace):
    """A task instance whose XComs are ``xcoms[(dag, run, task, map index, key)]``."""

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.dag_id, self.run_id, self.task_id, self.map_index, key)] = value

    def xcom_pull(self, *, task_ids: str, dag_id: str, run_id: str, map_indexes: int, key: str) -> Any:
        return self.xcoms.get((dag_id, run_id, task_ids, map_indexes, key))


def _context(xcoms: dict, task_id: str = "tune", store: dict | None = None, try_number: int = 1) -> dict[str, Any]:
    ti = _TI(dag_id="d", run_id="r1", task_id=task_id, map_index=-1, try_number=try_number, xcoms=xcoms)
    context: dict[str, Any] = {"ti": ti, "run_id": "r1"}
    if store is not None:
        context["task_state_store"] = SimpleNamespace(
            get=lambda k, default=None: store.get(k, default), set=store.__setitem__
        )
    return context


def _job(job_id: str, *, task_id: str = "tune", run_id: str = "r1", started: int = 5, try_number: str = "1") -> dict:
    metadata = {"airflow_dag_id": "d", "airflow_task_id": task_id, "airflow_map_index": "-1", "airflow_run_id": run_id}
    return {"submission_id": job_id, "start_time": started, "metadata": {**metadata, "airflow_try_number": try_number}}


def test_a_recorded_job_is_believed_by_its_own_task_and_by_a_downstream_reader():
    xcoms: dict = {}
    record_job(_context(xcoms), "exp-1", 5, None)
    SubmittedJobs(_context(xcoms), known={"exp-1"}).check(_job("exp-1"))  # the try that submitted it
    SubmittedJobs(_context(xcoms), resumed=True).check(_job("exp-1"))  # that try, resumed from a deferral
    SubmittedJobs(_context(xcoms, task_id="promote")).check(_job("exp-1"))  # reads the tune task's XCom
    # Before a deferral its XCom is not read: Airflow cleared it when the try started.
    with pytest.raises(ExperimentStorageError, match="exp-1 is not believed"):
        SubmittedJobs(_context(xcoms)).check(_job("exp-1"))


@pytest.mark.parametrize(
    ("job", "refusal"),
    [
        (_job("exp-2"), "Ray job exp-2 is not believed: Airflow has no record of task 'tune' of DAG 'd' in run 'r1'"),
        (_job("exp-1", started=6), "another job of that id, started at another time"),
        (_job("exp-1", run_id="r2"), "task 'tune' of DAG 'd' in run 'r2'"),
        (_job("exp-1", task_id="other"), "task 'other'"),
        ({"submission_id": "exp-1", "metadata": {}}, "the task instance it names \\(its metadata names none\\)"),
    ],
    ids=["unrecorded", "same-id-other-start", "other-run", "other-task", "no-owner"],
)
def test_a_job_the_record_does_not_list_is_refused_naming_it(job, refusal):
    xcoms: dict = {}
    record_job(_context(xcoms), "exp-1", 5, None)
    with pytest.raises(ExperimentStorageError, match=refusal):
        SubmittedJobs(_context(xcoms, task_id="promote")).check(job)


def test_airflow_3_3_keeps_the_record_across_tries_in_task_state_store():
    store: dict = {}
    record_job(_context({}, store=store), "exp-1", 5, None)
    assert store[RECORD_KEY] == {"exp-1": 5}
    # The next try: its XComs cleared, the store kept.
    retry = _context({}, store=store, try_number=2)
    SubmittedJobs(retry).check(_job("exp-1"))
    record_job(retry, "exp-2", 7, None)
    assert store[RECORD_KEY] == {"exp-1": 5, "exp-2": 7} and wait_for_record(retry, "exp-2", timeout_s=0)
    assert not wait_for_record(retry, "exp-3", timeout_s=0)


def test_proven_progress_follows_the_newest_job_airflow_recorded():
    xcoms: dict = {}
    record_job(_context(xcoms), "exp-1", 5, None)
    minted, ours = _job("exp-2", started=9), _job("exp-1")
    for job in (minted, ours):
        job["metadata"]["airflow_tune_experiment_uri"] = "s3://b/e"
    asked: list[str] = []
    hook = SimpleNamespace(
        find_jobs=lambda _: [minted, ours],  # newest first
        get_job_logs=lambda job_id: asked.append(job_id) or "",
    )
    submitted = SubmittedJobs(_context(xcoms, task_id="sense"))
    assert proven_progress(hook, "s3://b/e", None, reader=None, submitted=submitted) is None
    assert asked == ["exp-1"]
