"""Every state of RayTuneTrigger.run() and every branch of RayTuneOperator.resume_or_submit(), in seconds: a fake
hook and fake storage stand in for the dashboard and S3 (pure logic; the real ones are exercised end to end)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.common import jsonsafe
from airflow_tune.common.contract import (
    METADATA_EXPERIMENT,
    METADATA_EXPERIMENT_URI,
    METADATA_FINGERPRINT,
    METADATA_SPEC_DIGEST,
    METADATA_SPEC_URI,
    RESULT_FILE,
    digest_of,
)
from airflow_tune.common.provenance import seal_line
from airflow_tune.exceptions import ExperimentConflictError, ExperimentStorageError, RayJobError, RayJobNotFoundError
from airflow_tune.operators.tune import RayTuneOperator
from airflow_tune.triggers import tune as trigger_module
from airflow_tune.triggers.tune import RayTuneTrigger
from airflow_tune.trust.submitted import RECORD_KEY
from tests.support.fake_store import dict_stores

# -- the trigger ------------------------------------------------------------------------------------------------------


class FakeDashboard:
    """The hook as the trigger sees it: a job watch answering ``statuses`` in turn (None: the job is unknown)."""

    def __init__(self, statuses: list[str | None]) -> None:
        self.statuses = statuses
        self.stopped: list[str] = []
        self.waits: list[float] = []
        self.logs = ""

    @contextlib.asynccontextmanager
    async def async_session(self) -> AsyncIterator[FakeDashboard]:
        yield self

    @contextlib.asynccontextmanager
    async def watch_job(self, job_id: str) -> AsyncIterator[FakeDashboard]:
        yield self

    async def status(self) -> dict[str, Any] | None:
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return None if status is None else {"status": status, "message": f"job is {status}"}

    async def changed(self, timeout: float) -> bool:
        self.waits.append(timeout)
        return False

    async def async_get_job_info(self, job_id: str) -> dict[str, Any]:
        from airflow_tune.exceptions import RayJobNotFoundError

        raise RayJobNotFoundError(f"Ray job {job_id!r} not found")

    async def aget_endpoint(self) -> None:
        """The hook reads its connection on the loop before a stop (the real one asks the Task SDK)."""

    async def async_get_job_logs(self, job_id: str) -> str:
        return self.logs

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True


def _events(monkeypatch, dashboard: FakeDashboard, **kwargs: Any) -> tuple[list[dict], list[str]]:
    async def no_wait(seconds: float) -> None:
        return None

    monkeypatch.setattr(trigger_module.asyncio, "sleep", no_wait)
    trigger = RayTuneTrigger(job_id="j", poll_interval=1.0, **kwargs)
    monkeypatch.setattr(trigger, "_hook", lambda: dashboard)
    logged: list[str] = []
    monkeypatch.setattr(trigger.log, "info", lambda msg, *args: logged.append(msg % args))

    async def collect() -> list[dict]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(collect()), logged


def test_the_trigger_fires_once_when_the_job_ends_and_prints_progress_only_when_it_changes(monkeypatch):
    snapshots = iter(
        [
            ({"metric": "loss", "num_trials": 2, "counts": {"RUNNING": 2}, "best": None}, 1),
            (None, 1),  # unchanged since the last read
            (
                {
                    "metric": "loss",
                    "num_trials": 2,
                    "counts": {"TERMINATED": 2},
                    "best": {"value": 0.5, "trial_id": "t1"},
                },
                2,
            ),
        ]
    )
    monkeypatch.setattr("airflow_tune.common.storage.read_json_if_changed", lambda uri, seen: next(snapshots))
    dashboard = FakeDashboard(["RUNNING", "RUNNING", "SUCCEEDED"])
    events, logged = _events(monkeypatch, dashboard, log_interval=0.0, experiment_uri="s3://b/e")
    assert events == [
        {"status": "SUCCEEDED", "job_id": "j", "experiment_uri": "s3://b/e", "message": "job is SUCCEEDED"}
    ]
    assert logged == ["[airflow-tune] 2 trials: RUNNING=2", "[airflow-tune] 2 trials: TERMINATED=2 best loss=0.5 (t1)"]


def test_the_trigger_reports_a_job_the_cluster_does_not_know(monkeypatch):
    events, _ = _events(monkeypatch, FakeDashboard([None]), log_progress=False)
    # Not in the shared list, and not found when asked for alone.
    assert [e["status"] for e in events] == ["error"] and events[0]["message"] == "job not found"


def test_the_trigger_sleeps_until_its_job_changes_when_nothing_else_is_due(monkeypatch):
    dashboard = FakeDashboard(["RUNNING", "RUNNING", "SUCCEEDED"])
    _events(monkeypatch, dashboard, log_progress=False)
    assert dashboard.waits == [60.0, 60.0]  # woken by the shared poll, not by a timer


def test_the_trigger_fires_when_the_target_is_reached(monkeypatch):
    monkeypatch.setattr(trigger_module, "_read_progress", lambda uri: {"mode": "min", "best": {"value": 0.4}})
    dashboard = FakeDashboard(["RUNNING"])
    dashboard.logs = 'x\n[airflow-tune] progress {"counts": {"RUNNING": 1}, "mode": "min", "best": {"value": 0.4}}\n'
    events, _ = _events(monkeypatch, dashboard, log_progress=False, experiment_uri="s3://b/e", target=0.5)
    assert [e["status"] for e in events] == ["TARGET_REACHED"]


def test_a_progress_file_the_jobs_log_does_not_back_never_fires_the_target(monkeypatch):
    # Storage says 0.1 (anyone who can write it can say so); the engine's own line in the job log says 2.0.
    monkeypatch.setattr(trigger_module, "_read_progress", lambda uri: {"mode": "min", "best": {"value": 0.1}})
    dashboard = FakeDashboard(["RUNNING", "RUNNING", "SUCCEEDED"])
    dashboard.logs = '[airflow-tune] progress {"counts": {"RUNNING": 1}, "mode": "min", "best": {"value": 2.0}}\n'
    events, _ = _events(monkeypatch, dashboard, log_progress=False, experiment_uri="s3://b/e", target=0.5)
    assert [e["status"] for e in events] == ["SUCCEEDED"]


def test_the_trigger_stops_the_job_at_its_deadline(monkeypatch):
    dashboard = FakeDashboard(["RUNNING"])
    events, _ = _events(monkeypatch, dashboard, log_progress=False, deadline=time.time() - 1)
    assert [e["status"] for e in events] == ["timeout"] and dashboard.stopped == ["j"]


def test_a_sensors_trigger_gives_up_at_its_deadline_without_stopping_the_job(monkeypatch):
    dashboard = FakeDashboard(["RUNNING"])
    events, _ = _events(monkeypatch, dashboard, log_progress=False, deadline=time.time() - 1, stop_at_deadline=False)
    assert [(e["status"], e["message"]) for e in events] == [("timeout", "gave up")] and dashboard.stopped == []


def test_on_kill_stops_the_job(monkeypatch):
    dashboard = FakeDashboard(["RUNNING"])
    trigger = RayTuneTrigger(job_id="j")
    monkeypatch.setattr(trigger, "_hook", lambda: dashboard)
    asyncio.run(trigger.on_kill())
    assert dashboard.stopped == ["j"]


# -- resume_or_submit -------------------------------------------------------------------------------------------------


class FakeJobs:
    """The Jobs API as resume_or_submit sees it; ``submit_errors`` are raised by the next submits, in order."""

    def __init__(self, jobs: list[dict[str, Any]] | None = None, submit_errors: list[Exception] | None = None):
        self.jobs = jobs or []
        self.submit_errors = submit_errors or []
        self.submitted: list[dict[str, Any]] = []
        self.listings = 0
        self.logs: dict[str, str] = {}

    def check_ray_version(self) -> str:
        return "2.60.0"

    def find_jobs(self, metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        self.listings += 1
        return [j for j in self.jobs if j["metadata"].get(METADATA_EXPERIMENT) == metadata_filter[METADATA_EXPERIMENT]]

    def submit_job(self, **kwargs: Any) -> str:
        if self.submit_errors:
            raise self.submit_errors.pop(0)
        self.submitted.append(kwargs)
        self.jobs.append(
            {
                "submission_id": kwargs["submission_id"],
                "status": "PENDING",
                "metadata": kwargs["metadata"],
                "start_time": 2000 + len(self.jobs),
            }
        )
        return str(kwargs["submission_id"])

    def job_url(self, job_id: str) -> str:
        return f"http://ray/#/jobs/{job_id}"

    def get_job_info(self, job_id: str) -> dict[str, Any]:
        for job in self.jobs:
            if job["submission_id"] == job_id:
                return job
        raise RayJobNotFoundError(f"no job {job_id}")

    def get_job_logs(self, job_id: str) -> str:
        return self.logs.get(job_id, "")


@pytest.fixture
def files(monkeypatch) -> dict[str, Any]:
    XCOMS.clear()
    STORE.clear()
    """S3 as a dict: what the operator reads and writes."""
    stored: dict[str, Any] = {}
    monkeypatch.setattr(
        "airflow_tune.common.storage.read_json_or_none", lambda uri: json.loads(json.dumps(stored.get(uri)))
    )
    monkeypatch.setattr("airflow_tune.common.storage.write_json", stored.__setitem__)
    monkeypatch.setattr("airflow_tune.trust.disjoint.store_for", dict_stores(stored))  # and the disjointness probes
    monkeypatch.setattr(
        "airflow_tune.common.storage.write_bytes", lambda uri, data: stored.__setitem__(uri, json.loads(data))
    )
    monkeypatch.setattr("airflow_tune.common.storage.exists", lambda uri: uri in stored)
    monkeypatch.setattr(
        "airflow_tune.common.storage.read_bytes_or_none", lambda uri: _bytes(stored[uri]) if uri in stored else None
    )

    def file_digests(uri: str, recursive: bool = True) -> dict[str, str]:
        below = {k[len(uri.rstrip("/")) + 1 :]: v for k, v in stored.items() if k.startswith(uri.rstrip("/") + "/")}
        return {k: digest_of(_bytes(v)) for k, v in below.items() if recursive or "/" not in k}

    monkeypatch.setattr("airflow_tune.common.storage.file_digests", file_digests)
    return stored


def _bytes(manifest: Any) -> bytes:
    return jsonsafe.dumps(manifest, indent=1, sort_keys=True).encode()


def _sealed(manifest: Any) -> str:
    """A job log in which the engine vouched for ``manifest`` as its result.json."""
    return "some output\n" + seal_line(RESULT_FILE, digest_of(_bytes(manifest))) + "\n"


def _op(space: dict[str, Any] | None = None, **kwargs: Any) -> RayTuneOperator:
    return RayTuneOperator(
        task_id="tune",
        trainable="pkg.mod:train",
        storage_path="s3://bkt/exps",
        metric="loss",
        mode="min",
        experiment_name="exp",
        param_space=space or {"x": {"grid_search": [1, 2]}},
        ship_engine=False,
        **kwargs,
    )


#: Airflow's XComs as the task instances below see them (the record of their Ray jobs): pure logic, no Airflow.
XCOMS: dict[tuple[str, str, str, int, str], Any] = {}
OWN_TI = ("d", "manual__1", "tune", -1)


class FakeTI(SimpleNamespace):
    def xcom_push(self, key: str, value: Any) -> None:
        XCOMS[(self.dag_id, "manual__1", self.task_id, self.map_index, key)] = value

    def xcom_pull(self, *, task_ids: str, dag_id: str, run_id: str, map_indexes: int, key: str) -> Any:
        return XCOMS.get((dag_id, run_id, task_ids, map_indexes, key))


#: The task instance's ``task_state_store`` (Airflow 3.3), which keeps its record across tries.
STORE: dict[str, Any] = {}


def _record(job_id: str, started: int | None = None) -> None:
    """As the tune task instance records a job it submitted (an earlier try's, kept in its task_state_store)."""
    STORE[RECORD_KEY] = {**(STORE.get(RECORD_KEY) or {}), job_id: started}


def _context(try_number: int = 1, *, store: bool = True) -> dict[str, Any]:
    """The tune task instance's context; ``store=False``: Airflow before 3.3 (no task_state_store)."""
    ti = FakeTI(dag_id="d", task_id="tune", map_index=-1, try_number=try_number)
    context: dict[str, Any] = {"ti": ti, "run_id": "manual__1"}
    if store:
        context["task_state_store"] = SimpleNamespace(
            get=lambda key, default=None: STORE.get(key, default), set=STORE.__setitem__
        )
    return context


def _resume(op: RayTuneOperator, jobs: FakeJobs) -> tuple[str | None, dict[str, Any] | None]:
    op.__dict__["hook"] = jobs
    context = _context()
    return op.resume_or_submit(context, op.build_spec(context))  # type: ignore[arg-type]


def _live(
    spec_op: RayTuneOperator,
    files: dict[str, Any],
    job_id: str = "exp-1",
    status: str = "RUNNING",
    *,
    recorded: bool = True,
    try_number: int = 1,
) -> dict:
    """A job of the experiment as the tune task submits it; ``recorded``: Airflow recorded it (else it was minted
    through the Jobs API with the same metadata)."""
    spec = spec_op.build_spec(_context())  # type: ignore[arg-type]
    uri = f"s3://bkt/exps/exp/.airflow_tune/jobs/{job_id}-abc.json"
    files[uri] = spec.to_dict()
    metadata = {METADATA_EXPERIMENT: "exp", METADATA_FINGERPRINT: spec.fingerprint(), METADATA_SPEC_URI: uri}
    metadata[METADATA_EXPERIMENT_URI] = spec.experiment_uri
    metadata.update(airflow_dag_id="d", airflow_task_id="tune", airflow_map_index="-1", airflow_run_id="manual__1")
    metadata["airflow_try_number"] = str(try_number)
    if recorded:
        _record(job_id, 1000)
    return {"submission_id": job_id, "status": status, "metadata": metadata, "start_time": 1000}


def test_no_job_yet_submits_attempt_1_with_the_spec_in_storage(files):
    jobs = FakeJobs()
    job_id, result = _resume(_op(), jobs)
    assert (job_id, result) == ("exp-1", None)
    [submitted] = jobs.submitted
    spec_uri = submitted["metadata"][METADATA_SPEC_URI]
    assert spec_uri.startswith("s3://bkt/exps/exp/.airflow_tune/jobs/exp-1-") and files[spec_uri]["name"] == "exp"
    digest = submitted["metadata"][METADATA_SPEC_DIGEST]
    assert submitted["entrypoint"] == f"python -m airflow_tune.engine --spec {spec_uri} --spec-digest {digest}"


def test_a_live_job_with_the_same_spec_is_reattached(files):
    jobs = FakeJobs([_live(_op(), files)])
    assert _resume(_op(), jobs) == ("exp-1", None) and jobs.submitted == []


def test_a_live_job_with_another_spec_is_refused_naming_what_differs(files):
    jobs = FakeJobs([_live(_op({"x": {"grid_search": [3, 4]}}), files)])
    with pytest.raises(ExperimentConflictError, match=r"live Ray job exp-1\) with another spec: param_space.x: .*3, 4"):
        _resume(_op(), jobs)
    assert jobs.submitted == []


def test_a_recorded_spec_that_differs_is_refused_before_anything_is_submitted(files):
    other = _op({"x": {"grid_search": [3, 4]}}).build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = other.to_dict()
    jobs = FakeJobs()
    with pytest.raises(ExperimentConflictError, match=r"already exists \(s3://bkt/exps/exp\) with another spec"):
        _resume(_op(), jobs)
    assert jobs.submitted == []


def test_a_finished_result_of_the_same_spec_is_returned(files):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = spec.to_dict()
    result = _result(spec)
    files["s3://bkt/exps/exp/.airflow_tune/result.json"] = result
    jobs = FakeJobs([_live(_op(), files, status="SUCCEEDED")])
    jobs.logs["exp-1"] = _sealed(result)
    assert _resume(_op(), jobs) == ("exp-1", result) and jobs.submitted == []


@pytest.mark.parametrize(
    ("log", "jobs_known", "refusal"),
    [
        ("", True, "vouches for none"),
        ("other", True, "its bytes are not the ones Ray job exp-1 wrote"),
        ("sealed", False, "unknown to the cluster"),
    ],
    ids=["no-seal", "another-digest", "job-gone"],
)
def test_a_stored_result_is_believed_only_when_its_job_vouched_for_its_bytes(files, log, jobs_known, refusal):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = spec.to_dict()
    result = _result(spec)
    files["s3://bkt/exps/exp/.airflow_tune/result.json"] = result
    jobs = FakeJobs([_live(_op(), files, status="SUCCEEDED")] if jobs_known else [])
    jobs.logs["exp-1"] = {"": "", "other": _sealed({**result, "best_config": {"x": 2}}), "sealed": _sealed(result)}[log]
    with pytest.raises(ExperimentStorageError, match=refusal):
        _resume(_op(), jobs)
    assert jobs.submitted == []


def _result(spec: Any, **changes: Any) -> dict[str, Any]:
    """A result.json as the engine writes it for ``spec``."""
    return {
        "status": "succeeded",
        "experiment": spec.name,
        "experiment_uri": spec.experiment_uri,
        "owner": spec.owner,
        "job_id": "exp-1",
        "fingerprint": spec.fingerprint(),
        "best_config": {"x": 1},
        "best_checkpoint_uri": f"{spec.experiment_uri}/train_0/checkpoint_000001",
        **changes,
    }


OTHER_OWNER = {"dag_id": "other_dag", "task_id": "secret_task", "map_index": -1, "run_id": None}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"fingerprint": None}, "another spec"),
        ({"experiment_uri": "s3://bkt/exps/elsewhere"}, "names another experiment"),
        ({"best_checkpoint_uri": "s3://attacker/model/checkpoint_000001"}, "best checkpoint lies outside"),
        ({"best_checkpoint_uri": "s3://bkt/exps/exp/../other/checkpoint"}, "best checkpoint lies outside"),
    ],
)
def test_a_stored_result_is_believed_only_when_it_is_this_experiments_own(files, changes, why):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = spec.to_dict()
    files["s3://bkt/exps/exp/.airflow_tune/result.json"] = _result(spec, **changes)
    jobs = FakeJobs()
    with pytest.raises((ExperimentStorageError, ExperimentConflictError), match=why):
        _resume(_op(), jobs)
    assert jobs.submitted == []


@pytest.mark.parametrize("place", ["spec.json", "result.json", "job"])
def test_an_experiment_of_another_task_is_refused_naming_its_owner_and_none_of_its_values(files, place):
    other = _op({"x": {"grid_search": ["secret-value-1", "secret-value-2"]}}).build_spec(_context())  # type: ignore[arg-type]
    recorded = {**other.to_dict(), "owner": OTHER_OWNER}
    jobs = FakeJobs()
    if place == "spec.json":
        files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = recorded
    elif place == "result.json":
        files["s3://bkt/exps/exp/.airflow_tune/result.json"] = _result(other, owner=OTHER_OWNER)
    else:
        job = _live(_op({"x": {"grid_search": ["secret-value-1"]}}), files)
        job["metadata"].update(airflow_dag_id="other_dag", airflow_task_id="secret_task")
        jobs = FakeJobs([job])
    with pytest.raises(ExperimentConflictError) as raised:
        _resume(_op(), jobs)
    text = str(raised.value)
    assert "belongs to DAG 'other_dag', task 'secret_task'" in text, text
    assert "secret-value" not in text and "grid_search" not in text
    assert jobs.submitted == []


def test_a_recorded_experiment_with_no_owner_is_refused(files):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = {**spec.to_dict(), "owner": None}
    with pytest.raises(ExperimentConflictError, match="no recorded owner"):
        _resume(_op(), FakeJobs())


def test_an_explicit_name_is_shared_by_the_runs_of_one_task_and_a_default_name_by_one_run_only(files):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    assert spec.owner == {"dag_id": "d", "task_id": "tune", "map_index": -1, "run_id": None}
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = spec.to_dict()
    later = {"ti": _context()["ti"], "run_id": "scheduled__2"}
    op = _op()
    op.__dict__["hook"] = FakeJobs()
    assert op.resume_or_submit(later, op.build_spec(later))[0] == "exp-1"  # type: ignore[arg-type]
    # A default-named experiment records its run: the same name reached from another run is not its own.
    files["s3://bkt/exps/exp/.airflow_tune/spec.json"] = {**spec.to_dict(), "owner": {**spec.owner, "run_id": "r1"}}
    op = _op()
    op.__dict__["hook"] = FakeJobs()
    with pytest.raises(ExperimentConflictError, match="belongs to DAG 'd', task 'tune'"):
        op.resume_or_submit(later, op.build_spec(later))  # type: ignore[arg-type]


def test_a_failed_result_is_not_a_result_the_next_attempt_restores(files):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files["s3://bkt/exps/exp/.airflow_tune/result.json"] = {"status": "failed", "fingerprint": spec.fingerprint()}
    jobs = FakeJobs([_live(_op(), files, status="FAILED"), _live(_op(), files, job_id="exp-2", status="STOPPED")])
    assert _resume(_op(), jobs) == ("exp-3", None)


def test_the_next_job_restores_only_state_a_known_job_of_the_experiment_saved(files):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files[f"{spec.experiment_uri}/tuner.pkl"] = "a pickle"
    state = {"tuner.pkl": digest_of(_bytes("a pickle"))}
    restore = f" --restore-after exp-1 --restore-state '{json.dumps(state, separators=(',', ':'))}'"
    # An earlier job in Ray's job list licenses the restore, in the entrypoint only the submitter sets, of the state
    # files its log vouched for.
    jobs = FakeJobs([_live(_op(), files, status="STOPPED")])
    jobs.logs["exp-1"] = seal_line("state/tuner.pkl", state["tuner.pkl"]) + "\n"
    assert _resume(_op(), jobs) == ("exp-2", None)
    assert jobs.submitted[0]["entrypoint"].endswith(restore)
    # Bytes no job of the experiment vouched for: refused before anything is submitted.
    jobs = FakeJobs([_live(_op(), files, status="STOPPED")])
    jobs.logs["exp-1"] = seal_line("state/tuner.pkl", digest_of(b"what the job wrote")) + "\n"
    with pytest.raises(ExperimentStorageError, match="tuner.pkl: its bytes .* are none that this experiment's jobs"):
        _resume(_op(), jobs)
    assert jobs.submitted == []
    # A cluster that lost its job history: the earlier try's own record (task_state_store) licenses it, but no log
    # is left to prove the files: refused, unless the DAG file says its storage is its own.
    context = {**_context(), "task_state_store": SimpleNamespace(get=lambda key: "exp-1", set=lambda k, v: None)}
    jobs = FakeJobs()
    op = _op()
    op.__dict__["hook"] = jobs
    with pytest.raises(ExperimentStorageError, match="no longer knows .* set restore_unproven_state=True"):
        op.resume_or_submit(context, op.build_spec(context))  # type: ignore[arg-type]
    assert jobs.submitted == []
    jobs = FakeJobs()
    op = _op(restore_unproven_state=True)
    op.__dict__["hook"] = jobs
    assert op.resume_or_submit(context, op.build_spec(context)) == ("exp-1", None)  # type: ignore[arg-type]
    assert jobs.submitted[0]["entrypoint"].endswith(restore)
    # A first job: nothing to restore, and no licence (no earlier try of its task instance kept a job).
    STORE.clear()
    del files[f"{spec.experiment_uri}/tuner.pkl"]
    jobs = FakeJobs()
    _resume(_op(), jobs)
    assert "--restore-after" not in jobs.submitted[0]["entrypoint"]


@pytest.mark.parametrize("remembered", [None, "another-experiment-1"], ids=["none", "another-experiments-job"])
def test_tune_state_no_known_job_wrote_is_refused_before_anything_is_submitted(files, remembered):
    spec = _op().build_spec(_context())  # type: ignore[arg-type]
    files[f"{spec.experiment_uri}/tuner.pkl"] = "someone's pickle"
    jobs = FakeJobs()
    op = _op()
    op.__dict__["hook"] = jobs
    context = {**_context(), "task_state_store": SimpleNamespace(get=lambda key: remembered, set=lambda k, v: None)}
    with pytest.raises(ExperimentStorageError, match=r"Tune state \(tuner.pkl\) exists .* refusing to restore it"):
        op.resume_or_submit(context, op.build_spec(context))  # type: ignore[arg-type]
    assert jobs.submitted == []


def test_a_try_that_loses_the_race_to_submit_reattaches_to_the_winner(files):
    winner = _live(_op(), files)
    jobs = FakeJobs(submit_errors=[RayJobError("Ray job 'exp-1' already exists on http://ray")])
    original = jobs.find_jobs

    def find_after_race(metadata_filter: dict[str, Any]) -> list[dict[str, Any]]:
        if jobs.listings == 1:  # the other try's submit lands between our listing and our submit
            jobs.jobs.append(winner)
        return original(metadata_filter)

    jobs.find_jobs = find_after_race  # type: ignore[method-assign]
    assert _resume(_op(), jobs) == ("exp-1", None)
    assert jobs.submitted == [] and jobs.listings == 2


def test_any_other_submit_error_fails_the_try(files):
    jobs = FakeJobs(submit_errors=[RayJobError("The Ray Jobs API failed to submit (HTTP 400): bad runtime_env")])
    with pytest.raises(RayJobError, match="bad runtime_env"):
        _resume(_op(), jobs)


def test_restore_unproven_state_is_a_bool_written_in_the_dag_file():
    with pytest.raises(TypeError, match="restore_unproven_state must be True or False"):
        _op(restore_unproven_state="{{ params.trust }}")  # type: ignore[arg-type]
    assert "restore_unproven_state" not in RayTuneOperator.template_fields


def test_restore_unproven_state_mapped_from_an_xcom_is_refused_and_a_literal_expand_list_is_code():
    from unittest import mock

    from airflow.sdk import DAG, task

    from airflow_tune.trust.code import TUNE_CODE_ARGUMENTS, refuse_mapped_code

    @task
    def chosen() -> list[bool]:
        return [True]

    fixed = {"trainable": "pkg.mod:train", "storage_path": "s3://bkt/exps", "metric": "loss", "mode": "min"}
    for source, refused in ((chosen(), True), ([True], False)):
        with DAG("aft_unit_unproven_mapped", schedule=None) as dag:
            RayTuneOperator.partial(task_id="tune", **fixed).expand(restore_unproven_state=source)
        op = dag.task_dict["tune"].unmap({"restore_unproven_state": True})
        with (
            mock.patch.object(RayTuneOperator, "dag", dag),
            mock.patch.object(RayTuneOperator, "has_dag", lambda _: True),
        ):
            if refused:
                with pytest.raises(
                    ValueError, match=r"mapped from an XCom through expand\(\)(.|\n)*restore_unproven_state"
                ):
                    refuse_mapped_code(op, TUNE_CODE_ARGUMENTS)
            else:
                refuse_mapped_code(op, TUNE_CODE_ARGUMENTS)
                assert op.unproven_restore_allowed() is True


def test_a_job_airflow_did_not_record_is_refused_naming_it_and_nothing_is_submitted(files):
    # Same metadata as the task's own (anyone who can submit a Ray job can write it), but no record in Airflow.
    jobs = FakeJobs([_live(_op(), files, job_id="exp-1", recorded=False)])
    with pytest.raises(ExperimentConflictError, match=r"Ray job exp-1 is not believed: Airflow has no record of task "):
        _resume(_op(), jobs)
    assert jobs.submitted == []


def test_a_recorded_id_with_another_start_time_is_another_job(files):
    # A job of the recorded id on a head that lost its history is not the one the task submitted.
    minted = {**_live(_op(), files), "start_time": 9999}
    with pytest.raises(ExperimentConflictError, match="another job of that id, started at another time"):
        _resume(_op(), FakeJobs([minted]))


def test_a_submitted_job_is_recorded_with_its_start_time_for_the_next_reader(files):
    jobs = FakeJobs()
    assert _resume(_op(), jobs) == ("exp-1", None)
    # In the XCom, for the readers downstream, and in task_state_store, for the next try.
    assert XCOMS[(*OWN_TI, RECORD_KEY)] == STORE[RECORD_KEY] == {"exp-1": 2000}
    XCOMS.clear()  # Airflow clears a task's XComs when its next try starts
    op = _op()
    op.__dict__["hook"] = jobs
    context = _context(try_number=2)
    assert op.resume_or_submit(context, op.build_spec(context)) == ("exp-1", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("with_store", [False, True], ids=["airflow-3.1-3.2", "airflow-3.3"])
def test_an_earlier_tries_job_without_a_record_is_believed_only_where_airflow_keeps_no_record(files, with_store):
    # Before 3.3 nothing Airflow keeps survives a retry: the earlier try's job is believed by its metadata there.
    jobs = FakeJobs([_live(_op(), files, recorded=False, try_number=1)])
    op = _op()
    op.__dict__["hook"] = jobs
    context = _context(try_number=2, store=with_store)
    if with_store:
        with pytest.raises(ExperimentConflictError, match="exp-1 is not believed"):
            op.resume_or_submit(context, op.build_spec(context))  # type: ignore[arg-type]
    else:
        assert op.resume_or_submit(context, op.build_spec(context)) == ("exp-1", None)  # type: ignore[arg-type]
    # A job claiming a later (or the same) try is never an earlier try's.
    XCOMS.clear()
    jobs = FakeJobs([_live(_op(), files, recorded=False, try_number=2)])
    op = _op()
    op.__dict__["hook"] = jobs
    context = _context(try_number=2, store=False)
    with pytest.raises(ExperimentConflictError, match="exp-1 is not believed"):
        op.resume_or_submit(context, op.build_spec(context))  # type: ignore[arg-type]
