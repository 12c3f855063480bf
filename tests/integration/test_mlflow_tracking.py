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
import os
import tempfile
import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune import storage
from airflow_tune.contract import METADATA_EXPERIMENT, SPEC_FILE, manifest_uri
from airflow_tune.local import LocalStack
from airflow_tune.local.stack import stop_process_tree
from airflow_tune.spec import experiment_name_for
from tests.conftest import TEST_ROOT, _environment, _stop_and_check_nothing_is_left
from tests.support import engine_jobs as jobs
from tests.support.cluster_venv import cluster_python
from tests.support.mlflow_server import MlflowRest, mlflow_python, params, tags
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(300)
SECRET = "s3cr3t-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def tracked() -> Iterator[LocalStack]:
    """Ray head (cluster virtualenv), S3 endpoint, MLflow server and a migrated Airflow home; stopped, and checked
    that nothing of it is left, even when tests fail (the last test stops the MLflow server itself)."""
    local = LocalStack(
        Path(tempfile.mkdtemp(prefix="tracking-", dir=TEST_ROOT)),
        num_cpus=2,
        cluster_python=cluster_python(),
        mlflow_python=mlflow_python(),
        airflow_home=os.environ["AIRFLOW_HOME"],
    )
    state = local.start()
    try:
        with _environment(state.env()):
            yield local
    finally:
        _stop_and_check_nothing_is_left(local)


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
