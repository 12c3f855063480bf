"""Storage roots through Airflow (dag.test on the local stack): a conf that steers the storage path out of its root
(a query string, a fragment, ``..``, an escape, userinfo, another bucket, a path mapped from an XCom) is refused
before any Ray job exists and before anything is written; an ordinary team tail runs; a deployment root admits a fully
templated path; and a ``file://`` storage path on a shared filesystem runs an experiment to success with its
checkpoint there."""

from __future__ import annotations

import json
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune.checkpoints import download_checkpoint
from airflow_tune.common.spec import experiment_name_for
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")
FILE = "storage_cases.py"
OTHER_BUCKET = "aft-other-bucket"


def _date() -> datetime:
    return datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _keys_naming(s3_client, name: str) -> list[str]:
    """Every object key in every bucket of the endpoint that holds ``name``."""
    found = []
    for bucket in s3_client.list_buckets()["Buckets"]:
        for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket["Name"]):
            found += [f"{bucket['Name']}/{o['Key']}" for o in page.get("Contents", []) if name in o["Key"]]
    return found


@pytest.fixture
def other_bucket(s3_client) -> str:
    """A second bucket that exists, so a refused path is refused by the rule, not by a missing bucket."""
    if OTHER_BUCKET not in [b["Name"] for b in s3_client.list_buckets()["Buckets"]]:
        s3_client.create_bucket(Bucket=OTHER_BUCKET)
    return OTHER_BUCKET


@pytest.mark.timeout(300)
def test_a_conf_that_steers_the_storage_path_out_of_its_root_is_refused_before_anything(s3_client, other_bucket):
    storage = load_dag("aft_storage_team_tail", FILE).get_task("tune").storage_path.split("/{{")[0]
    bucket = storage.split("://", 1)[1].split("/", 1)[0]
    cases = [
        ("query", "aft_storage_team_tail", {"team": "team-a?endpoint_override=127.0.0.1:1"}, "query string"),
        ("fragment", "aft_storage_team_tail", {"team": "team-a#"}, "fragment"),
        ("dotdot", "aft_storage_team_tail", {"team": "../../other-team"}, "'..'"),
        ("escaped-dotdot", "aft_storage_team_tail", {"team": "%2e%2e/%2e%2e/other"}, "percent-escape"),
        ("userinfo", "aft_storage_from_conf", {"path": f"s3://key:secret@{bucket}/experiments"}, "userinfo"),
        ("port", "aft_storage_from_conf", {"path": f"s3://{bucket}:9000/experiments"}, "port"),
        ("other-bucket", "aft_storage_from_conf", {"path": f"s3://{other_bucket}/x"}, "lies under no storage root"),
        ("same-bucket-no-root", "aft_storage_from_conf", {"path": storage}, "lies under no storage root"),
        ("mapped-from-xcom", "aft_storage_mapped_from_xcom", {"path": storage}, "lies under no storage root"),
    ]
    for case, dag_id, conf, words in cases:
        run = run_dag(load_dag(dag_id, FILE), conf, logical_date=_date())
        assert run.state == "failed", case
        [error] = run.errors("tune")
        assert isinstance(error, ValueError), (case, error)
        assert "storage_path = " in str(error) and words in str(error), (case, str(error))
        name = experiment_name_for(dag_id, "tune", run.run_id, 0 if "mapped" in dag_id else -1)
        assert jobs_of(name) == [], case
        assert _keys_naming(s3_client, name) == [], case


@pytest.mark.timeout(240)
def test_an_ordinary_team_tail_runs_under_the_dag_files_root(s3_client):
    run = run_dag(load_dag("aft_storage_team_tail", FILE), {"team": "team-b"}, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    name = experiment("aft_storage_team_tail", run.run_id)
    storage = load_dag("aft_storage_team_tail", FILE).get_task("tune").storage_path.split("/{{")[0]
    assert result["experiment_uri"] == f"{storage}/team-b/{name}"
    assert result["best_checkpoint_uri"].startswith(f"{storage}/team-b/{name}/")
    assert any(key.endswith(f"/team-b/{name}/.airflow_tune/result.json") for key in _keys_naming(s3_client, name))


@pytest.mark.timeout(240)
def test_a_deployment_root_admits_a_fully_templated_path(monkeypatch, s3_client, other_bucket):
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS", f"s3://{other_bucket}/experiments")
    path = f"s3://{other_bucket}/experiments/team-c"
    run = run_dag(load_dag("aft_storage_from_conf", FILE), {"path": path}, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    name = experiment("aft_storage_from_conf", run.run_id)
    assert run.xcom("tune")["experiment_uri"] == f"{path}/{name}"
    assert f"{other_bucket}/experiments/team-c/{name}/.airflow_tune/result.json" in _keys_naming(s3_client, name)


@pytest.mark.timeout(240)
def test_a_file_storage_path_runs_an_experiment_end_to_end(s3_client):
    dag = load_dag("aft_storage_file", FILE)
    storage = dag.get_task("tune").storage_path
    assert storage.startswith("file:///")
    run = run_dag(dag, None, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    name = experiment("aft_storage_file", run.run_id)
    folder = Path(storage.removeprefix("file://")) / name
    assert result["experiment_uri"] == f"{storage}/{name}"
    assert result["num_trials"] == 1 and result["num_terminated"] == 1 and result["num_errored"] == 0
    assert result["best_config"]["x"] == 3 and result["best_trial_id"]
    assert json.loads((folder / ".airflow_tune" / "result.json").read_text())["experiment"] == name
    assert list((folder / ".airflow_tune" / "jobs").glob("*.json")), "the operator wrote the job's spec there"
    # The best checkpoint is a file:// URI on the shared filesystem, and loads like any other.
    checkpoint = result["best_checkpoint_uri"]
    assert checkpoint.startswith(f"file://{folder}/") and Path(checkpoint.removeprefix("file://")).is_dir()
    with tempfile.TemporaryDirectory() as local:
        state = json.loads((Path(download_checkpoint(checkpoint, local)) / "state.json").read_text())
    assert state["step"] == 1 and state["x"] == 3
    assert _keys_naming(s3_client, name) == []  # nothing of it went to S3
