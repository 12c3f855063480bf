"""Trials tracked in MLflow (issue 24), on the real stack: a Ray head of the cluster virtualenv (mlflow-skinny, as the
Ray image), the S3 endpoint, a real MLflow server, and Airflow through ``dag.test()``.

What a user sees: one parent run per experiment and one run per trial (config as params, every metric per
training_iteration, the trial's status) under the MLflow experiment ``airflow-tune/<dag>/<task>``; no secret of the
connection anywhere the job carries; a restored experiment continuing the same runs; a server that does not answer
or refuses failing the task before any job; a server that dies mid-run reported in the task log while the
experiment succeeds. Runs are read back over plain HTTP (:class:`~tests.support.mlflow_server.MlflowRest`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import METADATA_EXPERIMENT, SPEC_FILE, manifest_uri
from airflow_tune.common.spec import experiment_name_for
from airflow_tune.local import LocalStack
from airflow_tune.local.stack import stop_process_tree
from tests.conftest import separate_stack
from tests.support import engine_jobs as jobs
from tests.support.mlflow_server import MlflowRest, mlflow_python, params, tags
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(300)
SECRET = "s3cr3t-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def tracked() -> Iterator[LocalStack]:
    """Ray head (cluster virtualenv), S3 endpoint, MLflow server and a migrated Airflow home; stopped, and checked
    that nothing of it is left, even when tests fail (the last test stops the MLflow server itself)."""
    with separate_stack("tracking-", num_cpus=2, mlflow_python=mlflow_python()) as local:
        yield local


def _date() -> datetime:
    return datetime(2007, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _run(dag_id: str, conf: dict, logical_date: datetime | None = None):
    from tests.e2e.helpers import load_dag, run_dag

    return run_dag(load_dag(dag_id, "mlflow_cases.py"), conf, logical_date or _date())


def _mlflow_experiment(rest: MlflowRest, name: str) -> dict:
    return dict(rest.get("experiments/get-by-name", experiment_name=name)["experiment"])


def _runs_of(rest: MlflowRest, experiment_id: str, experiment: str) -> tuple[dict, list[dict]]:
    """(the parent run, the trial runs) of one airflow-tune experiment."""
    runs = [r for r in rest.runs(experiment_id) if tags(r).get("airflow_tune.experiment") == experiment]
    parents = [r for r in runs if tags(r).get("airflow_tune.role") == "parent"]
    assert len(parents) == 1, [tags(r) for r in runs]
    children = [r for r in runs if tags(r).get("mlflow.parentRunId") == parents[0]["info"]["run_id"]]
    assert len(children) == len(runs) - 1, "every run but the parent is one of its trials"
    return parents[0], children


def test_each_trial_is_a_run_under_one_parent_with_params_metric_history_status_and_no_secret(tracked, monkeypatch):
    """dag.test() of a RayTuneOperator with ``mlflow_tracking`` rendered from a template (``{"tags": ...}``): the
    connection's password reaches neither the spec in storage, nor the job's metadata, runtime_env or log, nor
    MLflow, nor the XCom."""
    from tests.e2e.helpers import jobs_of

    state = tracked.state
    assert state is not None and state.mlflow_url is not None
    conn = {"conn_type": "http", "host": state.mlflow_url, "login": "someone", "password": SECRET}
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_SECRET", json.dumps(conn))
    run = _run(
        "aft_mlflow_secret", {"space": {"x": {"grid_search": [1, 3]}, "steps": 3}, "tracking": {"tags": {"team": "ml"}}}
    )
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    experiment = experiment_name_for("aft_mlflow_secret", "tune", run.run_id, -1)
    assert result["experiment"] == experiment
    tracking = result["mlflow"]
    assert set(tracking) == {"tracking_uri", "experiment_id", "parent_run_id", "best_run_id"}
    assert tracking["tracking_uri"] == state.mlflow_url

    rest = MlflowRest(state.mlflow_url)
    found = _mlflow_experiment(rest, "airflow-tune/aft_mlflow_secret/tune")
    assert found["experiment_id"] == tracking["experiment_id"]
    parent, children = _runs_of(rest, tracking["experiment_id"], experiment)
    assert parent["info"]["run_id"] == tracking["parent_run_id"]
    assert parent["info"]["run_name"] == experiment and parent["info"]["status"] == "FINISHED"
    parent_tags = tags(parent)
    assert parent_tags["airflow_tune.dag_id"] == "aft_mlflow_secret" and parent_tags["airflow_tune.task_id"] == "tune"
    assert parent_tags["airflow_tune.run_id"] == run.run_id and parent_tags["team"] == "ml"
    assert len(children) == result["num_trials"] == 2
    manifest = storage.read_json_or_none(manifest_uri(result["experiment_uri"], "result.json"))
    assert manifest is not None
    assert manifest["mlflow"]["runs"] == {tags(r)["airflow_tune.trial_id"]: r["info"]["run_id"] for r in children}
    for child in children:
        trial_id = tags(child)["airflow_tune.trial_id"]
        assert child["info"]["status"] == "FINISHED" and child["info"]["run_name"] == trial_id
        assert tags(child)["airflow_tune.role"] == "trial" and tags(child)["team"] == "ml"
        x = int(params(child)["x"])
        assert params(child) == {"x": str(x), "steps": "3"}
        history = sorted(rest.history(child["info"]["run_id"], "loss"), key=lambda m: m["step"])
        assert [m["step"] for m in history] == [1, 2, 3]  # one point per result, at its training_iteration
        assert [m["value"] for m in history] == pytest.approx([(x - 3) ** 2 + 1.0 / (s + 1) for s in range(3)])
        if trial_id == result["best_trial_id"]:
            assert child["info"]["run_id"] == tracking["best_run_id"] == parent_tags["airflow_tune.best_run_id"]
    best = rest.history(parent["info"]["run_id"], "best_loss")
    assert [m["value"] for m in best] == pytest.approx([result["best_metrics"]["loss"]])

    # No secret anywhere the job carries or the experiment keeps.
    [job] = jobs_of(experiment)
    texts = {
        "spec.json": storage.read_bytes(manifest_uri(result["experiment_uri"], SPEC_FILE)).decode(),
        "job spec": storage.read_bytes(job["metadata"]["airflow_tune_spec_uri"]).decode(),
        "job metadata and runtime_env": json.dumps(job),
        "job log": jobs.logs(state, job["submission_id"]),
        "xcom": json.dumps(result),
        "mlflow runs": json.dumps(rest.runs(tracking["experiment_id"])),
    }
    assert job["metadata"][METADATA_EXPERIMENT] == experiment
    assert "mlflow" in json.loads(texts["spec.json"]) and state.mlflow_url in texts["spec.json"]
    for where, text in texts.items():
        assert SECRET not in text, f"the connection's password is in the {where}"


def _tracking(state, name: str) -> dict:
    return {"tracking_uri": state.mlflow_url, "experiment_name": name, "tags": {}}


def test_a_restored_experiment_continues_the_same_runs(tracked, tmp_path):
    """The driver is stopped (SIGINT, Tune saves its state) while trial x=1 is held after its step 1, x=0 finished and
    x=2 not started; the rerun restores the experiment. Its runs are the same: the parent and the two trial runs seen
    before the stop keep their ids, the run count equals the trial count, and no training_iteration is logged twice."""
    state = tracked.state
    rest = MlflowRest(state.mlflow_url)
    hold = tmp_path / "hold"
    hold.write_text("")
    name = jobs.unique_name("mlflow-restore")
    spec = jobs.base_spec(
        state,
        name,
        "tune_testkit.functions:checkpointing",
        param_space={
            "x": {"grid_search": [0, 1, 2]},
            "steps": 4,
            "marker_dir": str(tmp_path / "marks"),
            "hold": {"x": 1, "step": 1, "file": str(hold)},
        },
        max_concurrent_trials=1,
        mlflow=_tracking(state, f"restore-{name}"),
    )
    job_id = jobs.submit(state, spec)
    marks = str(tmp_path / "marks")
    jobs.wait_until(
        lambda: any(m["x"] == 1 and m["step"] == 1 for m in read_markers(marks, "step")), 120, "x=1 held at step 1"
    )
    experiment_id = _mlflow_experiment(rest, f"restore-{name}")["experiment_id"]
    jobs.wait_until(lambda: len(rest.runs(experiment_id)) == 3, 60, "the parent and two trial runs in MLflow")
    parent, before = _runs_of(rest, experiment_id, name)
    jobs.client(state).stop_job(job_id)
    assert jobs.wait(state, job_id, 120) == "STOPPED"
    parent, stopped = _runs_of(rest, experiment_id, name)
    # The stopped driver ended what ran as KILLED; the finished trial stays FINISHED.
    assert parent["info"]["status"] == "KILLED"
    assert sorted(r["info"]["status"] for r in stopped) == ["FINISHED", "KILLED"], [tags(r) for r in stopped]
    hold.unlink()

    _, manifest = jobs.run_ok(state, spec)
    parent_after, after = _runs_of(rest, experiment_id, name)
    assert parent_after["info"]["run_id"] == parent["info"]["run_id"] == manifest["mlflow"]["parent_run_id"]
    assert parent_after["info"]["status"] == "FINISHED"
    ids_before = {tags(r)["airflow_tune.trial_id"]: r["info"]["run_id"] for r in before}
    ids_after = {tags(r)["airflow_tune.trial_id"]: r["info"]["run_id"] for r in after}
    assert len(after) == manifest["num_trials"] == 3, "one run per trial, none duplicated"
    assert {t: ids_after[t] for t in ids_before} == ids_before, "the runs seen before the stop were continued"
    assert manifest["mlflow"]["runs"] == ids_after
    for run in after:
        assert run["info"]["status"] == "FINISHED"
        steps = [m["step"] for m in rest.history(run["info"]["run_id"], "loss")]
        assert sorted(steps) == [1, 2, 3, 4], (tags(run)["airflow_tune.trial_id"], steps)


def test_the_engine_fails_before_any_trial_when_the_cluster_cannot_reach_the_server(tracked, tmp_path):
    """The Airflow side's preflight passed, the cluster cannot reach the server: the job fails at the engine's
    start (bad setup, exit code 2), its verdict names the server, and no trial ran."""
    from airflow_tune.local.ports import free_port

    state = tracked.state
    dead = f"http://127.0.0.1:{free_port()}"
    spec = jobs.base_spec(
        state,
        jobs.unique_name("mlflow-dead"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"grid_search": [1, 2]}, "steps": 2, "marker_dir": str(tmp_path)},
        mlflow=_tracking(state, "dead"),
    )
    spec["mlflow"]["tracking_uri"] = dead
    job_id = jobs.submit(state, spec)
    assert jobs.wait(state, job_id, 180) == "FAILED"
    assert jobs.exit_code(state, job_id) == 2  # a setup error, as a bad spec
    assert storage.read_json_or_none(jobs.result_uri(spec)) is None
    text = jobs.logs(state, job_id)
    verdicts = [line for line in text.splitlines() if "verdict: " in line]
    assert verdicts and f"the MLflow tracking server {dead}" in verdicts[-1], text[-3000:]
    assert "no trial has run" in verdicts[-1]
    assert read_markers(str(tmp_path), "start") == []


def test_another_owners_parent_run_is_refused_at_the_start_and_its_owners_retry_adopts_it(tracked, tmp_path):
    """Issue 30, finding 6. DAG A's experiment fails once (every trial errors), leaving its parent run. DAG B names
    the same experiment and MLflow experiment, on another cluster's storage (A's job is in no job list B's task
    could see): its job fails at the engine's start, before any trial, with a verdict naming the MLflow experiment,
    the parent run and A's owner, and A's parent run is as A left it (status, tags, metrics, best_loss history) with
    no run added. A's retry then adopts its own parent run and continues its trial runs."""
    state = tracked.state
    rest = MlflowRest(state.mlflow_url)
    name = jobs.unique_name("mlflow-owner")
    mlflow_name = f"airflow-tune/aft_owner_a/tune-{name}"
    owner_a = {"dag_id": "aft_owner_a", "task_id": "tune", "map_index": -1, "run_id": None}
    spec_a = jobs.base_spec(
        state,
        name,
        "tune_testkit.functions:fails_first_run",
        param_space={"x": {"grid_search": [1, 2]}, "marker_dir": str(tmp_path)},
        owner=owner_a,
        mlflow=_tracking(state, mlflow_name),
    )
    status, text, _ = jobs.run(state, spec_a)
    assert status == "FAILED" and "all 2 trials errored" in text, text[-3000:]
    experiment_id = _mlflow_experiment(rest, mlflow_name)["experiment_id"]
    parent, children = _runs_of(rest, experiment_id, name)
    parent_id = parent["info"]["run_id"]
    assert parent["info"]["status"] == "FAILED" and len(children) == 2
    before = rest.get("runs/get", run_id=parent_id)["run"]
    best_before = rest.history(parent_id, "best_loss")
    runs_before = sorted(r["info"]["run_id"] for r in rest.runs(experiment_id))

    b_marks = tmp_path / "b"
    b_marks.mkdir()
    spec_b = {
        **spec_a,
        "storage_path": f"{state.storage_uri}/other-cluster",
        "owner": {**owner_a, "dag_id": "aft_owner_b"},
        "param_space": {**spec_a["param_space"], "marker_dir": str(b_marks)},
    }
    job_id = jobs.submit(state, spec_b)
    assert jobs.wait(state, job_id, 180) == "FAILED"
    assert jobs.exit_code(state, job_id) == 2  # a setup error, as a bad spec
    text = jobs.logs(state, job_id)
    verdicts = [line for line in text.splitlines() if "verdict: " in line]
    assert verdicts, text[-3000:]
    verdict = verdicts[-1]
    assert f"MLflow experiment {mlflow_name!r}" in verdict and f"parent run {parent_id}" in verdict, verdict
    assert "belongs to DAG 'aft_owner_a', task 'tune'" in verdict and "experiment_name" in verdict, verdict
    assert "no trial has run" in verdict and spec_a["storage_path"] + "/" + name not in verdict, verdict
    assert list(b_marks.iterdir()) == [], "no trial of B ran"
    assert storage.read_json_or_none(jobs.result_uri(spec_b)) is None
    assert rest.get("runs/get", run_id=parent_id)["run"] == before, "A's parent run is as A left it"
    assert rest.history(parent_id, "best_loss") == best_before
    assert sorted(r["info"]["run_id"] for r in rest.runs(experiment_id)) == runs_before, "no run added"

    # The same owner's retry (as after a restarted head): its own parent run and trial runs, continued.
    _, manifest = jobs.run_ok(state, spec_a)
    parent, after = _runs_of(rest, experiment_id, name)
    assert parent["info"]["run_id"] == parent_id == manifest["mlflow"]["parent_run_id"]
    assert parent["info"]["status"] == "FINISHED" and len(after) == manifest["num_trials"] == 2
    assert {r["info"]["run_id"] for r in after} == {r["info"]["run_id"] for r in children}
    assert len(rest.history(parent_id, "best_loss")) == len(best_before) + 1
    assert tags(parent)["airflow_tune.dag_id"] == "aft_owner_a" and tags(parent)["airflow_tune.map_index"] == "-1"
    assert "airflow_tune.run_id" not in tags(parent)  # a named experiment: its owner has no run


@pytest.mark.parametrize("server", ["unreachable", "refusing"])
def test_a_server_that_does_not_answer_or_refuses_fails_the_task_before_any_job(tracked, monkeypatch, server):
    """The preflight: nothing listening, or a server answering 403; the task fails naming the server and the cause,
    and no job was submitted and nothing written beside the experiment."""
    from airflow_tune.local.ports import free_port
    from tests.e2e.helpers import jobs_of
    from tests.integration.test_healthchecks import http_server

    with http_server(lambda path: (403, b"forbidden")) as refusing_port:
        port = free_port() if server == "unreachable" else refusing_port
        url = f"http://127.0.0.1:{port}"
        conn = {"conn_type": "http", "host": url}
        monkeypatch.setenv(f"AIRFLOW_CONN_MLFLOW_{server.upper()}", json.dumps(conn))
        dag_id = f"aft_mlflow_{server}"
        run = _run(dag_id, {"space": {"x": {"grid_search": [1]}, "steps": 1}})
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert type(error).__name__ == "MLflowError", error
    cause = "does not answer" if server == "unreachable" else "refuses the credentials (HTTP 403)"
    assert f"the MLflow tracking server {url}" in str(error) and cause in str(error), error
    experiment = experiment_name_for(dag_id, "tune", run.run_id, -1)
    assert jobs_of(experiment) == []
    storage_uri = f"{tracked.state.storage_uri}/{experiment}"
    assert storage.read_json_or_none(manifest_uri(storage_uri, SPEC_FILE)) is None
    assert storage.list_files(storage_uri) == []


def test_a_server_that_dies_mid_run_is_reported_in_the_task_log_and_the_experiment_succeeds(tracked, tmp_path, capfd):
    """Runs last in the module: it stops the module's MLflow server (by its pid) once both trials have their runs and
    wait after their first step; the trials go on, the experiment succeeds, and the task log says how many MLflow
    calls failed and the last error."""
    state = tracked.state
    rest = MlflowRest(state.mlflow_url)
    gate = tmp_path / "gate"
    gate.write_text("")
    marks = str(tmp_path / "marks")
    space = {"x": {"grid_search": [1, 3]}, "steps": 3, "marker_dir": marks, "gate": {"step": 0, "file": str(gate)}}
    stopped: list[BaseException | None] = []

    def stop_the_server_mid_run() -> None:
        try:
            jobs.wait_until(lambda: len(read_markers(marks, "step")) >= 2, 120, "both trials at their gate")
            experiment_id = _mlflow_experiment(rest, "airflow-tune/aft_mlflow_tracked/tune")["experiment_id"]
            jobs.wait_until(
                lambda: sum(tags(r).get("airflow_tune.role") == "trial" for r in rest.runs(experiment_id)) >= 2,
                60,
                "both trial runs in MLflow",
            )
            stop_process_tree(state.mlflow_pid, grace=5)
            stopped.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            stopped.append(exc)
        finally:
            gate.unlink(missing_ok=True)

    helper = threading.Thread(target=stop_the_server_mid_run, daemon=True)
    helper.start()
    try:
        run = _run("aft_mlflow_tracked", {"space": space})
    finally:
        gate.unlink(missing_ok=True)
        helper.join(60)
    assert stopped == [None], stopped
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    assert result["num_terminated"] == 2 and result["mlflow"]["parent_run_id"]
    manifest = storage.read_json_or_none(manifest_uri(result["experiment_uri"], "result.json"))
    assert manifest is not None and manifest["mlflow"]["errors"] > 0, manifest["mlflow"]
    log = capfd.readouterr()
    text = log.out + log.err
    assert "MLflow tracking:" in text and "call(s) failed" in text and "the experiment went on" in text, text[-4000:]
