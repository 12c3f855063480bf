"""RayTuneOperator and RayTuneSensor in DAGs run by ``dag.test()`` against the real local Ray head and S3 endpoint."""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from airflow_tune.links.ray import RayJobLink
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, stop_live_jobs

pytestmark = pytest.mark.usefixtures("stack")


BROWSER_URL = "https://ray-dashboard.example.invalid/ray"


def _view_of(run: Any) -> dict[str, Any]:
    """The Experiment view's JSON for the run's tune task, from Airflow's database and the experiment's files."""
    from airflow.utils.session import create_session

    from airflow_tune.plugins.experiment_app import lookup_task
    from airflow_tune.plugins.experiment_shape import build_view

    with create_session() as session:
        facts = lookup_task(session, run.dag_run.dag_id, run.run_id, "tune", -1)
    return build_view(facts)


def _unique_date() -> datetime:
    """A logical date no other test uses, so its run id (and experiment) is new."""
    return datetime(2001, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.mark.timeout(240)
def test_blocking_and_deferred_give_the_same_xcom_contract_and_downstream_loads_the_checkpoint(monkeypatch, stack):
    blocking = run_dag(load_dag("tune_roundtrip_blocking", "tune_roundtrip.py"), logical_date=_unique_date())
    # The deferred run's connection names a browser-facing dashboard_url no API call could reach (.invalid never
    # resolves): the run succeeds only if the API calls still go to the host, and its links must use the extra.
    conn = {**json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"]), "extra": {"dashboard_url": BROWSER_URL + "/"}}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(conn))
    # A run with no logical date (as the UI, the REST API and `airflow dags trigger` make them).
    deferred = run_dag(load_dag("tune_roundtrip_deferred", "tune_roundtrip.py"), logical_date=None)
    assert deferred.dag_run.logical_date is None

    results = {}
    for run in (blocking, deferred):
        assert run.state == "success", (run.task_states(), run.errors("tune"))
        result = run.xcom("tune")
        assert set(result) == set(RESULT_KEYS)
        # The experiment is named from the run id, never from a logical date.
        assert result["experiment"] == experiment(run.dag_run.dag_id, run.run_id)
        assert result["experiment_uri"].endswith("/" + result["experiment"])
        assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["num_errored"] == 0
        assert result["best_checkpoint_uri"].startswith(f"{result['experiment_uri']}/")
        base = BROWSER_URL if run is deferred else stack.dashboard_url
        assert result["dashboard_url"] == f"{base}/#/jobs/{result['job_id']}"
        assert run.xcom("tune", RayJobLink.key) == result["dashboard_url"]
        # The view links the job on the deployment's cluster (the ray_default connection as it is now, whose
        # browser URL the deferred run set), from the XCom's job id only.
        assert _view_of(run)["ray_job_url"] == f"{BROWSER_URL}/#/jobs/{result['job_id']}"
        [job] = jobs_of(result["experiment"])
        assert job["submission_id"] == result["job_id"] and job["status"] == "SUCCEEDED"
        # The downstream task read best_config and loaded the best checkpoint's state from S3.
        winner = run.xcom("use_winner")
        assert winner == {"x": 3, "checkpoint_x": 3, "checkpoint_loss": result["best_metrics"]["loss"]}
        results[run.dag_run.dag_id] = result
    blocking_result, deferred_result = results["tune_roundtrip_blocking"], results["tune_roundtrip_deferred"]
    assert blocking_result["best_config"] == deferred_result["best_config"] == {"x": 3, "steps": 3}
    assert blocking_result["best_metrics"]["loss"] == deferred_result["best_metrics"]["loss"]
    for key in ("metric", "mode", "num_trials", "num_terminated", "num_errored"):
        assert blocking_result[key] == deferred_result[key], key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["blocking", "deferred"])
def test_a_trainable_that_raises_fails_the_task_within_seconds_naming_the_trial_error(tmp_path, mode):
    run = run_dag(
        load_dag(f"aft_boom_{mode}"),
        {"space": {"x": {"grid_search": [1, 2]}, "marker_dir": str(tmp_path)}},
        logical_date=_unique_date(),
    )
    assert run.state == "failed"
    assert run.task_states() == {"tune": "failed"}
    [error] = run.errors("tune")
    text = str(error)
    name = experiment(f"aft_boom_{mode}", run.run_id)
    # The engine's verdict comes first; Ray's generic status line after it.
    assert text.splitlines()[0] == f"experiment {name} failed: all 2 trials errored", text[:2000]
    assert "FAILED" in text.splitlines()[1] and "last available logs" not in text.splitlines()[1]
    # Each trial error: the exception's own line, and where its full text is kept.
    trial_errors = text.split("Trial errors:\n", 1)[1].split("Last lines of the job log:", 1)[0]
    for x in (1, 2):
        [line] = [ln for ln in trial_errors.splitlines() if f"ValueError: boom: bad x={x}" in ln]
        assert " errored: ValueError: boom: bad x=" in line and "(full text: s3://" in line and "/error.txt)" in line
    [job] = jobs_of(experiment(f"aft_boom_{mode}", run.run_id))
    assert job["status"] == "FAILED"


@pytest.mark.timeout(120)
def test_an_unimportable_trainable_fails_with_the_engines_verdict_first():
    run = run_dag(load_dag("aft_unimportable"), logical_date=_unique_date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    first = str(error).splitlines()[0]
    name = experiment("aft_unimportable", run.run_id)
    assert first.startswith(
        f"experiment {name} failed: EngineError: trainable 'no_such_pkg.train:fn': "
        "cannot import module 'no_such_pkg.train' on the cluster"
    ), str(error)[:2000]
    assert "ship it with the job" in first


@pytest.mark.timeout(60)
def test_a_missing_bucket_fails_before_any_job_naming_the_bucket():
    run = run_dag(load_dag("aft_no_bucket"), logical_date=_unique_date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    first = str(error).splitlines()[0]
    assert first.startswith("cannot write the experiment's spec to s3://no-such-bucket-aft/experiments/"), first
    assert "bucket does not exist" in first and "Airflow workers may write to it" in first, first
    assert jobs_of(experiment("aft_no_bucket", run.run_id)) == []


@pytest.mark.timeout(60)
def test_a_bad_spec_argument_fails_before_any_job_is_submitted():
    run = run_dag(load_dag("aft_bad_spec"), logical_date=_unique_date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert isinstance(error, ValueError)
    assert "mode" in str(error) and "maximize" in str(error)
    assert jobs_of(experiment("aft_bad_spec", run.run_id)) == []
    assert not run.xcom("tune", RayJobLink.key)  # Airflow stores the link's value at the end: "" (no job)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["poke", "deferred"])
def test_submit_then_sense_returns_the_operators_xcom_contract(mode):
    run = run_dag(load_dag(f"aft_submit_{mode}"), logical_date=_unique_date())
    assert run.state == "success", (run.task_states(), run.errors("submit"), run.errors("sense"))
    submitted = run.xcom("submit")
    assert set(submitted) == {"job_id", "experiment", "experiment_uri", "dashboard_url"}
    assert submitted["experiment"] == experiment(f"aft_submit_{mode}", run.run_id, task_id="submit")
    sensed = run.xcom("sense")
    assert set(sensed) == {*RESULT_KEYS, "finished"} and sensed["finished"] is True
    assert sensed["job_id"] == submitted["job_id"]
    assert sensed["experiment_uri"] == submitted["experiment_uri"]
    assert sensed["best_config"] == {"x": 3, "steps": 2}
    assert sensed["num_terminated"] == 2 and sensed["best_checkpoint_uri"].startswith(submitted["experiment_uri"])
    [job] = jobs_of(submitted["experiment"])
    assert job["status"] == "SUCCEEDED"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["poke", "deferred"])
def test_sensor_succeeds_early_once_the_best_metric_reaches_its_target(mode):
    # x=3 reports loss 1.0 at its first step (target 1.5); the whole experiment takes 12+ s more.
    space = {"x": {"grid_search": [1, 3]}, "steps": 12, "sleep": 1.0}
    run = run_dag(load_dag(f"aft_target_{mode}"), {"space": space}, logical_date=_unique_date())
    name = experiment(f"aft_target_{mode}", run.run_id, task_id="submit")
    try:
        assert run.state == "success", (run.task_states(), run.errors("sense"))
        sensed = run.xcom("sense")
        assert set(sensed) == {*RESULT_KEYS, "finished"}
        assert sensed["finished"] is False
        assert sensed["best_config"]["x"] == 3 and sensed["best_metrics"]["loss"] <= 1.5
        assert sensed["num_terminated"] < 2
        # The sensor did not wait for the end: the experiment still runs.
        [job] = jobs_of(name)
        assert job["status"] == "RUNNING"
    finally:
        stop_live_jobs(name)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["poke", "deferred"])
def test_a_forged_progress_file_never_ends_the_sensor_early(mode):
    """Anyone who can write the experiment's storage prefix can write its progress.json: a writer keeps one there
    whose best (0.1) reaches the sensor's target (1.5) while the only trial (x=1) never gets below 4. The sensor
    believes the engine's progress line in the job's log, not the file: it waits for the end and returns the
    finished experiment's result (on 4c117b0 it ended early with the forged best)."""
    import threading

    from airflow_tune.common import storage
    from airflow_tune.common.contract import PROGRESS_FILE, manifest_uri
    from tests.e2e.helpers import run_id_for

    space = {"x": {"grid_search": [1]}, "steps": 6, "sleep": 1.0}
    date = _unique_date()
    name = experiment(f"aft_target_{mode}", run_id_for(date), task_id="submit")
    uri = manifest_uri(f"{os.environ['AIRFLOW_TUNE_STORAGE_URI'].rstrip('/')}/{name}", PROGRESS_FILE)
    done, forged = threading.Event(), []

    def forge() -> None:
        while not done.wait(0.05):
            try:
                real = storage.read_json_or_none(uri)
                if real and (real.get("best") or {}).get("value") != 0.1:
                    trial = (real.get("best") or {}).get("trial_id") or "forged"
                    real["best"] = {"trial_id": trial, "value": 0.1, "config": {"x": 3, "steps": 99}}
                    storage.write_json(uri, real)
                    forged.append(trial)
            except Exception:  # the writer keeps trying while the engine rewrites the file
                continue

    writer = threading.Thread(target=forge, daemon=True)
    writer.start()
    try:
        run = run_dag(load_dag(f"aft_target_{mode}"), {"space": space}, logical_date=date)
    finally:
        done.set()
        writer.join(10)
        stop_live_jobs(name)
    assert forged, "the forger never found a progress.json to rewrite"
    assert run.state == "success", (run.task_states(), run.errors("sense"))
    sensed = run.xcom("sense")
    assert sensed["finished"] is True and sensed["num_terminated"] == 1, sensed
    assert sensed["best_config"]["x"] == 1 and sensed["best_metrics"]["loss"] > 4, sensed


@pytest.mark.timeout(120)
def test_a_deferred_sensor_gives_up_at_its_timeout_and_leaves_the_job_running():
    space = {"x": {"grid_search": [1]}, "steps": 40, "sleep": 1.0}
    run = run_dag(load_dag("aft_sense_timeout"), {"space": space}, logical_date=_unique_date())
    name = experiment("aft_sense_timeout", run.run_id, task_id="submit")
    try:
        assert run.task_states() == {"submit": "success", "sense": "failed"}
        [error] = run.errors("sense")
        assert type(error).__name__ == "AirflowSensorTimeout" and "timed out after 5" in str(error), error
        [job] = jobs_of(name)
        assert job["status"] == "RUNNING"  # the sensor waits for someone else's job: it never stops it
    finally:
        stop_live_jobs(name)


def teardown_module() -> None:
    # Nothing a failed test started keeps running on the shared head.
    from airflow_tune.hooks.ray import RayHook

    try:
        hook = RayHook()
        for job in hook.list_jobs():
            if job["status"] in ("PENDING", "RUNNING") and str(job["metadata"].get("airflow_dag_id", "")).startswith(
                ("aft_", "tune_roundtrip")
            ):
                hook.stop_job(job["submission_id"])
    except Exception:
        pass


@pytest.mark.timeout(180)
def test_a_spec_of_2_mb_runs(tmp_path):
    """The spec travels through storage: 2 MB of trainable_kwargs (a job's env var stops at 128 KB, the Jobs API at
    about 2 MB) reach the trainable, and the deferred task ends."""
    run = run_dag(load_dag("aft_large_kwargs"), logical_date=_unique_date())
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    assert result["best_metrics"]["blob_len"] == 2_000_000 and result["num_terminated"] == 2
