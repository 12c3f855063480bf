"""Experiments are disjoint, through Airflow (dag.test on the local stack's Ray head and S3 endpoint): a first DAG's
run makes an experiment; a second DAG's conf that aims its experiment folder into the first one's best checkpoint
folder, around the first one's folder, or into a model registry is refused before any Ray job exists, naming the
field, the folder and its owner, and the first experiment's objects are byte for byte as they were; a sibling
experiment under the same tail runs, and so does a new job of it that restores it (its folder already its own)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.e2e.helpers import jobs_of, load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")
FILE = "disjoint_cases.py"


def _date() -> datetime:
    return datetime(2005, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _storage() -> str:
    return str(load_dag("aft_disjoint_first", FILE).get_task("tune").storage_path).split("/{{")[0]


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _objects(s3_client: Any, uri: str) -> dict[str, tuple[str, bytes]]:
    """Every object below ``uri``: key -> (ETag, bytes)."""
    bucket, prefix = _split(uri)
    out = {}
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for listed in page.get("Contents", []):
            body = s3_client.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read()
            out[listed["Key"]] = (listed["ETag"], body)
    return out


@pytest.fixture(scope="module")
def first(stack) -> dict[str, Any]:
    """The first DAG's experiment, run to success: ``<root>/disjoint-<id>/team-<id>/first``."""
    unique = uuid.uuid4().hex[:8]
    top, team = f"disjoint-{unique}", f"team-{unique}"
    conf = {"tail": f"{top}/{team}", "name": "first"}
    run = run_dag(load_dag("aft_disjoint_first", FILE), conf, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    result = run.xcom("tune")
    folder = f"{_storage()}/{top}/{team}/first"
    assert result["experiment_uri"] == folder and result["best_checkpoint_uri"].startswith(folder + "/")
    return {"top": top, "team": team, "folder": folder, "result": result}


def _refused(s3_client: Any, first: dict[str, Any], conf: dict[str, str]) -> str:
    """Run the second DAG with ``conf``: it fails naming the rule, no Ray job of its experiment exists, nothing of
    it was written, and every object of the first experiment is as it was."""
    before = _objects(s3_client, first["folder"])
    run = run_dag(load_dag("aft_disjoint_second", FILE), conf, logical_date=_date())
    assert run.state == "failed", conf
    [error] = run.errors("tune")
    assert isinstance(error, ValueError) and type(error).__name__ == "NestedFolderError", (conf, error)
    assert jobs_of(conf["name"]) == [], conf
    assert _objects(s3_client, f"{_storage()}/{conf['tail']}/{conf['name']}/.airflow_tune") == {}, conf
    assert _objects(s3_client, first["folder"]) == before, conf
    text = str(error)
    assert "grid_search" not in text and "tune_testkit" not in text  # nothing of the first experiment's spec
    return text


@pytest.mark.timeout(300)
def test_a_conf_aiming_into_the_first_experiments_checkpoint_folder_is_refused_and_its_files_unchanged(
    s3_client, first
):
    checkpoint = first["result"]["best_checkpoint_uri"]
    tail = checkpoint.removeprefix(_storage() + "/")  # disjoint-<id>/team-<id>/first/<trial>/checkpoint_...
    name = f"second-{uuid.uuid4().hex[:8]}"
    text = _refused(s3_client, first, {"tail": tail, "name": name})
    assert text.startswith("storage_path = 's3://"), text  # the value as rendered, cut at 80 characters
    assert (
        f": the experiment folder {checkpoint}/{name} would lie inside the folder of another experiment, "
        f"{first['folder']} (DAG 'aft_disjoint_first', task 'tune')"
    ) in text, text
    assert text.endswith(f"Choose a storage_path outside {first['folder']} (beside it, for instance)"), text


@pytest.mark.timeout(300)
def test_a_conf_making_a_folder_that_holds_the_first_experiment_is_refused(s3_client, first):
    # The second experiment's folder would be <root>/disjoint-<id>/team-<id>: the first one's parent.
    text = _refused(s3_client, first, {"tail": first["top"], "name": first["team"]})
    parent = f"{_storage()}/{first['top']}/{first['team']}"
    assert text.startswith(
        f"experiment_name = '{first['team']}': the experiment folder {parent} holds the folder of another "
        f"experiment, {first['folder']} (DAG 'aft_disjoint_first', task 'tune')"
    ), text
    assert text.endswith("whose folder holds no experiment and no registry"), text


@pytest.mark.timeout(300)
def test_a_conf_aiming_into_a_model_registry_is_refused_naming_its_owner(s3_client, first):
    registry = f"{_storage()}/{first['top']}/models/digits"
    bucket, prefix = _split(registry)
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/champion.json", Body=json.dumps({"version": "1"}).encode())
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/owner.json", Body=json.dumps({"dag_id": "aft_deploys"}).encode())
    name = f"second-{uuid.uuid4().hex[:8]}"
    text = _refused(s3_client, first, {"tail": f"{first['top']}/models/digits/versions", "name": name})
    assert f"would lie inside the folder of a model registry, {registry} (DAG 'aft_deploys')" in text, text


@pytest.mark.timeout(420)
def test_a_sibling_experiment_runs_and_a_new_job_of_it_restores_in_its_own_folder(s3_client, first):
    name = f"sibling-{uuid.uuid4().hex[:8]}"
    conf = {"tail": f"{first['top']}/{first['team']}", "name": name}
    before = _objects(s3_client, first["folder"])
    run = run_dag(load_dag("aft_disjoint_second", FILE), conf, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    folder = f"{_storage()}/{first['top']}/{first['team']}/{name}"
    assert run.xcom("tune")["experiment_uri"] == folder
    # Its result gone, the next run of the task finds the finished job and submits one that restores the experiment:
    # the folder holds its own manifests, so the check lets it through.
    bucket, prefix = _split(folder)
    s3_client.delete_object(Bucket=bucket, Key=f"{prefix}/.airflow_tune/result.json")
    again = run_dag(load_dag("aft_disjoint_second", FILE), conf, logical_date=_date())
    assert again.state == "success", again.errors("tune")
    assert again.xcom("tune")["experiment_uri"] == folder
    assert len(jobs_of(name)) == 2
    assert _objects(s3_client, first["folder"]) == before
