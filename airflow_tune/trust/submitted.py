"""Airflow's record of the Ray jobs a task instance submitted: what makes a job's metadata and log believed.

A job's metadata and log are the cluster's: anyone who may submit a Ray job (every DAG author through the
connection, every trial: Ray hands its token to the workers) can submit one whose metadata names an experiment and
its task, and whose log prints seals. So the Airflow side believes a job (reattaches to it, restores what it saved,
takes its result, seals or progress) only when Airflow's record of the task instance its metadata names lists it:

- the tune task records every job it submits or reattaches to, with the start time Ray gave it (a job of the same id
  on a new head is another job), in its XCom (key :data:`RECORD_KEY`, written by the task's own worker) and, on
  Airflow 3.3 and newer, in its ``task_state_store`` (kept across tries: Airflow clears a task's XComs at each new try);
- a reader (the task's next try, a later run sharing the experiment name, the promote task, the sensor) reads that
  record through the Task SDK and refuses, naming it, a job the record does not list.

On Airflow 3.1 and 3.2 nothing Airflow keeps survives a retry, so a retry there believes the jobs of the task
instance's earlier tries by their metadata (as before); downstream readers need no more than the producing try's XCom.
Imports neither ray nor boto3 nor airflow at module level.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from airflow_tune.common.contract import METADATA_OWNER
from airflow_tune.exceptions import ExperimentStorageError

#: The XCom key (and ``task_state_store`` key) of a tune task instance's record: ``{submission id: start time}``.
RECORD_KEY = "airflow_tune_ray_jobs"
#: The job metadata keys the tune task sets (``reconcile.job_metadata``) naming its run and try.
METADATA_RUN_ID = "airflow_run_id"
METADATA_TRY_NUMBER = "airflow_try_number"


def _as_record(value: Any) -> dict[str, int | None]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): (v if isinstance(v, int) and not isinstance(v, bool) else None) for k, v in value.items()}


def _own_key(context: Any) -> tuple[str, str, str, int]:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return str(ti.dag_id), str(context["run_id"]), str(ti.task_id), -1 if map_index is None else int(map_index)


def own_record(context: Any, *, resumed: bool = False) -> dict[str, int | None]:
    """The jobs this task instance recorded: its ``task_state_store`` (3.3 and newer, every try) and, when the task
    resumes from a deferral (``resumed``), its XCom (this try's: Airflow clears a task's XComs when a try starts, so
    there is none to read before)."""
    record: dict[str, int | None] = {}
    store = context.get("task_state_store")
    if store is not None:
        try:
            record.update(_as_record(store.get(RECORD_KEY)))
        except Exception:  # a store that does not answer holds nothing to believe
            pass
    if resumed:
        record.update(_xcom_record(context, _own_key(context)))
    return record


def record_job(context: Any, job_id: str, started: int | None, log: Any) -> None:
    """Add ``job_id`` (started at ``started``, Ray's ``start_time``) to this task instance's record."""
    record = {**own_record(context), job_id: started}
    store = context.get("task_state_store")
    if store is not None:
        try:
            store.set(RECORD_KEY, record)
        except Exception as exc:
            log.warning("Could not record Ray job %s in task_state_store: %s", job_id, exc)
    context["ti"].xcom_push(key=RECORD_KEY, value=record)


def wait_for_record(context: Any, job_id: str, *, timeout_s: float, interval_s: float = 0.2) -> bool:
    """Wait until this task instance's record lists ``job_id`` (another try of it just submitted that job); return
    whether it does."""
    import time

    deadline = time.monotonic() + timeout_s
    while job_id not in own_record(context, resumed=True):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def _xcom_record(context: Any, key: tuple[str, str, str, int]) -> dict[str, int | None]:
    dag_id, run_id, task_id, map_index = key
    pull = getattr(context["ti"], "xcom_pull", None)
    if pull is None:
        return {}
    try:
        value = pull(task_ids=task_id, dag_id=dag_id, run_id=run_id, map_indexes=map_index, key=RECORD_KEY)
    except Exception:  # no such run or task: no record
        return {}
    return _as_record(value)


class SubmittedJobs:
    """Checks Ray jobs against Airflow's record of the task instance each names, read through ``context`` (a task's
    context, with the Task SDK's ``ti``); each record is read once.

    :param context: the reading task's context.
    :param log: where a pre-3.3 retry says it believes an earlier try's job by its metadata.
    :param known: jobs this try of the task itself submitted or reattached to, in this process (recorded already).
    :param resumed: the task's XCom holds a record to read: this try resumes from a deferral, or another try of it
        has just recorded there the job both submitted at the same moment.
    """

    def __init__(self, context: Any, log: Any = None, *, known: Collection[str] = (), resumed: bool = False) -> None:
        self.context = context
        self.log = log
        self.known = frozenset(known)
        self.resumed = resumed
        self._records: dict[tuple[str, str, str, int], dict[str, int | None]] = {}

    def check(self, info: Mapping[str, Any]) -> None:
        """Raise :class:`ExperimentStorageError` unless the job ``info`` (Ray's job details) is in the record."""
        job = str(info.get("submission_id") or "")
        metadata = info.get("metadata") or {}
        named = self.named_task(metadata)
        if named is not None:
            own = named == _own_key(self.context)
            if own and job in self.known:
                return
            if named not in self._records:
                self._records[named] = (
                    own_record(self.context, resumed=self.resumed) if own else _xcom_record(self.context, named)
                )
            record = self._records[named]
            if job in record and record[job] in (None, info.get("start_time")):
                return
            if own and job not in record and self._earlier_try_before_3_3(job, metadata):
                return
        raise ExperimentStorageError(
            f"Ray job {job[:200]} is not believed: Airflow has no record of "
            + (self.describe(named) if named else "the task instance it names (its metadata names none)")
            + " submitting it (or it is another job of that id, started at another time). Anyone who can submit a "
            "Ray job can name an experiment in its metadata; only what Airflow recorded counts. Stop that job "
            f"(`ray job stop {job[:200]}`), or give this task another experiment_name"
        )

    @staticmethod
    def named_task(metadata: Mapping[str, Any]) -> tuple[str, str, str, int] | None:
        """The task instance a job's metadata names (DAG, run, task, map index), or None."""
        values = [metadata.get(METADATA_OWNER["dag_id"]), metadata.get(METADATA_RUN_ID)]
        values.append(metadata.get(METADATA_OWNER["task_id"]))
        try:
            map_index = int(metadata.get(METADATA_OWNER["map_index"], -1))
        except (TypeError, ValueError):
            return None
        if not all(isinstance(v, str) and v for v in values):
            return None
        return str(values[0]), str(values[1]), str(values[2]), map_index

    @staticmethod
    def describe(named: tuple[str, str, str, int]) -> str:
        dag_id, run_id, task_id, map_index = (str(v)[:250] for v in named)
        index = f", map index {map_index}" if map_index != "-1" else ""
        return f"task {task_id!r} of DAG {dag_id!r} in run {run_id!r}{index}"

    def _earlier_try_before_3_3(self, job: str, metadata: Mapping[str, Any]) -> bool:
        """Airflow 3.1 and 3.2 keep nothing across tries (no ``task_state_store``; XComs cleared): a job an earlier
        try of this task instance submitted is believed by its metadata there."""
        if self.context.get("task_state_store") is not None:
            return False
        try:
            theirs = int(str(metadata.get(METADATA_TRY_NUMBER)))
            ours = int(getattr(self.context["ti"], "try_number", 0))
        except (TypeError, ValueError):
            return False
        if theirs >= ours:
            return False
        if self.log is not None:
            self.log.warning(
                "Believing Ray job %s of this task instance's try %s by its metadata: Airflow before 3.3 keeps no "
                "record of a task instance's jobs across tries (Airflow 3.3's task_state_store does)",
                job[:200],
                theirs,
            )
        return True
