"""Promotion and warm start in DAGs run by ``dag.test()`` on the real stack: the Asset event (and the queued run of
the asset-scheduled DAG) only when the winner is promoted, downstream tasks skipped or run when it is not, and
RayTuneOperator's warm start from a registry's champion or an XCom dict."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.operators.promote import CHAMPION_FILE, registry_asset, split_s3_uri
from tests.e2e.dags.promote_cases import NOSKIP_REGISTRY, SKIP_REGISTRY
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, run_id_for, wait_for

pytestmark = pytest.mark.usefixtures("stack")

FILE = "promote_cases.py"


def _unique_date() -> datetime:
    return datetime(2002, 2, 2, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _clear(s3: Any, uri: str) -> None:
    bucket, prefix = split_s3_uri(uri)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])


def _checkpoint(s3: Any, files: dict[str, bytes]) -> str:
    prefix = f"exp-e2e/{uuid.uuid4().hex[:10]}/trial/checkpoint_000001"
    for rel, body in files.items():
        s3.put_object(Bucket="airflow-tune", Key=f"{prefix}/{rel}", Body=body)
    return f"s3://airflow-tune/{prefix}"


def _result(checkpoint: str, loss: float, trial: str, dag_id: str) -> dict[str, Any]:
    """The tune task's XCom result for ``checkpoint``'s experiment, its result.json sealed by a Ray job of ``dag_id``
    (the promote task re-reads and proves it)."""
    from tests.support.sealed import sealed_result

    return sealed_result(
        {
            "experiment": "exp-e2e",
            "experiment_uri": checkpoint.split("/trial/")[0],
            "job_id": "raysubmit_e2e",
            "metric": "loss",
            "mode": "min",
            "best_trial_id": trial,
            "best_config": {"x": 3},
            "best_metrics": {"loss": loss},
            "best_checkpoint_uri": checkpoint,
            "num_trials": 1,
            "num_terminated": 1,
            "num_errored": 0,
            "dashboard_url": None,
        },
        dag_id,
        run_id=None,
    )


def _champion(s3: Any, registry: str) -> dict[str, Any] | None:
    bucket, prefix = split_s3_uri(registry)
    try:
        return dict(json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}")["Body"].read()))
    except s3.exceptions.NoSuchKey:
        return None


def _asset_events(dag_id: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
        return [(str(uri), dict(extra)) for uri, extra in rows]


def _queued_runs(target_dag_id: str) -> list[str]:
    """Rows of the asset DAG-run queue: the scheduler creates a run of ``target_dag_id`` from each."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return [
            str(uri)
            for uri in session.scalars(
                select(AssetModel.uri)
                .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
                .where(AssetDagRunQueue.target_dag_id == target_dag_id)
            )
        ]


def _unpause_and_clear_queue(dag_id: str) -> None:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        model = session.get(DagModel, dag_id)
        assert model is not None, f"{dag_id} was not synced to the DB with its bundle"
        model.is_paused = False
        session.execute(delete(AssetDagRunQueue).where(AssetDagRunQueue.target_dag_id == dag_id))


@pytest.mark.timeout(120)
def test_asset_event_and_downstream_only_when_promoted(s3_client):
    registry_uri = registry_asset(SKIP_REGISTRY).uri
    _clear(s3_client, SKIP_REGISTRY)
    # A champion that a loss of 0.5 does not beat.
    bucket, prefix = split_s3_uri(SKIP_REGISTRY)
    seed = {"version": "seed", "value": 0.1, "metric": "loss", "mode": "min", "config": {"x": 1}}
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(seed).encode())

    worse = run_dag(
        load_dag("aft_promote_skip", FILE),
        {"result": _result(_checkpoint(s3_client, {"w.bin": b"worse"}), 0.5, "worse_00000", "aft_promote_skip")},
        logical_date=_unique_date(),
    )
    assert worse.state == "success", (worse.task_states(), worse.errors("promote"))
    assert worse.task_states() == {"tune": "success", "promote": "success", "deploy": "skipped"}
    decision = worse.xcom("promote")
    assert decision["promoted"] is False and "does not beat champion 0.1 (min)" in decision["reason"]
    assert _asset_events("aft_promote_skip", worse.run_id) == []
    assert _champion(s3_client, SKIP_REGISTRY) == seed

    # The asset-scheduled consumer now exists in the DB (dag.test syncs the whole bundle); unpause it, as a user would.
    _unpause_and_clear_queue("aft_promote_consumer")
    assert _queued_runs("aft_promote_consumer") == []

    better = run_dag(
        load_dag("aft_promote_skip", FILE),
        {
            "result": _result(
                _checkpoint(s3_client, {"w.bin": b"better", "d/x": b"x"}), 0.05, "better_00001", "aft_promote_skip"
            )
        },
        logical_date=_unique_date(),
    )
    assert better.state == "success", (better.task_states(), better.errors("promote"))
    assert better.task_states() == {"tune": "success", "promote": "success", "deploy": "success"}
    decision = better.xcom("promote")
    assert decision["promoted"] is True and "-better_00001-" in decision["version"]  # <stamp>-<trial>-<experiment>
    assert better.xcom("deploy") == {"deployed": decision["version"], "promoted": True}
    champion = _champion(s3_client, SKIP_REGISTRY)
    assert champion is not None and champion["version"] == decision["version"] and champion["value"] == 0.05
    [(uri, extra)] = _asset_events("aft_promote_skip", better.run_id)
    assert uri == registry_uri and extra == {
        "version": decision["version"],
        "value": 0.05,
        "metric": "loss",
        "registry": registry_uri,
        "version_folder": decision["version_folder"],
        "files_digest": decision["files_digest"],
        "file_count": len(decision["registered_files"]),
    }
    # The consumer scheduled on the registry's Asset is queued for a run.
    assert _queued_runs("aft_promote_consumer") == [registry_uri]


@pytest.mark.timeout(120)
def test_without_skipping_downstream_runs_and_still_no_asset_event(s3_client):
    _clear(s3_client, NOSKIP_REGISTRY)
    bucket, prefix = split_s3_uri(NOSKIP_REGISTRY)
    seed = {"version": "seed", "value": 0.1, "metric": "loss", "mode": "min", "config": {}}
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(seed).encode())
    run = run_dag(
        load_dag("aft_promote_noskip", FILE),
        {"result": _result(_checkpoint(s3_client, {"w.bin": b"w"}), 0.9, "worse_00000", "aft_promote_noskip")},
        logical_date=_unique_date(),
    )
    assert run.state == "success", (run.task_states(), run.errors("promote"))
    assert run.task_states() == {"tune": "success", "promote": "success", "deploy": "success"}
    assert run.xcom("deploy") == {"deployed": None, "promoted": False}
    assert _asset_events("aft_promote_noskip", run.run_id) == []
    assert _champion(s3_client, NOSKIP_REGISTRY) == seed


def _manifest(s3: Any, result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    bucket, prefix = split_s3_uri(result["experiment_uri"])
    read = lambda name: json.loads(  # noqa: E731
        s3.get_object(Bucket=bucket, Key=f"{prefix}/.airflow_tune/{name}")["Body"].read()
    )
    return read("spec.json"), read("result.json")


def _first_trial(manifest: dict[str, Any]) -> dict[str, Any]:
    [first] = [t for t in manifest["trials"] if str(t["trial_id"]).endswith("_00000")]
    return dict(first["config"])


@pytest.mark.timeout(180)
def test_warm_start_from_the_registry_champion_and_without_one(s3_client):
    registry = f"s3://airflow-tune/e2e-registry/warm-{uuid.uuid4().hex[:8]}"
    bucket, prefix = split_s3_uri(registry)
    champion = {"version": "v1", "value": 0.2, "metric": "loss", "mode": "min"}
    champion["config"] = {"x": 2.5, "steps": 7, "not_in_space": "dropped"}
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(champion).encode())

    warm = run_dag(load_dag("aft_warm_start_registry", FILE), {"registry": registry}, logical_date=_unique_date())
    assert warm.state == "success", (warm.task_states(), warm.errors("tune"))
    spec, manifest = _manifest(s3_client, warm.xcom("tune"))
    # Only the sampled key is kept: "steps" is a constant of the space, "not_in_space" is not in it.
    assert spec["points_to_evaluate"] == [{"x": 2.5}]
    assert _first_trial(manifest) == {"x": 2.5, "steps": 1}
    assert manifest["num_trials"] == 2

    # No champion yet: no warm start, the search still runs.
    empty = f"s3://airflow-tune/e2e-registry/empty-{uuid.uuid4().hex[:8]}"
    cold = run_dag(load_dag("aft_warm_start_registry", FILE), {"registry": empty}, logical_date=_unique_date())
    assert cold.state == "success", (cold.task_states(), cold.errors("tune"))
    spec, manifest = _manifest(s3_client, cold.xcom("tune"))
    assert not spec.get("points_to_evaluate")
    assert manifest["num_trials"] == 2 and manifest["num_terminated"] == 2


@pytest.mark.timeout(180)
def test_a_deferred_task_believes_its_result_without_reading_the_warm_start_registry_again(s3_client):
    """execute_complete believes the result by the spec execute() deferred with (issue 32): a registry that stops
    answering while the job runs (its champion.json no longer JSON) fails nothing, and the spec is the one run."""
    registry = f"s3://airflow-tune/e2e-registry/deferred-{uuid.uuid4().hex[:8]}"
    bucket, prefix = split_s3_uri(registry)
    champion = {"version": "v1", "value": 0.2, "metric": "loss", "mode": "min", "config": {"x": 2.5}}
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(champion).encode())
    logical_date = _unique_date()
    name = experiment("aft_warm_start_deferred", run_id_for(logical_date))
    broken_while: list[str] = []

    def break_the_registry_while_the_job_runs() -> None:
        live = wait_for(lambda: [j for j in jobs_of(name) if j["status"] in ("PENDING", "RUNNING")], 90, "the job")
        s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=b"{not json")
        broken_while.extend(j["status"] for j in jobs_of(name) if j["submission_id"] == live[0]["submission_id"])

    breaker = threading.Thread(target=break_the_registry_while_the_job_runs, daemon=True)
    breaker.start()
    run = run_dag(load_dag("aft_warm_start_deferred", FILE), {"registry": registry}, logical_date=logical_date)
    breaker.join(timeout=10)
    # The registry broke before the job ended, so before the trigger fired and execute_complete ran.
    assert broken_while and broken_while[0] in ("PENDING", "RUNNING"), broken_while
    assert run.state == "success", (run.task_states(), run.errors("tune"))
    spec, manifest = _manifest(s3_client, run.xcom("tune"))
    assert spec["points_to_evaluate"] == [{"x": 2.5}]
    assert _first_trial(manifest) == {"x": 2.5, "steps": 1}


@pytest.mark.timeout(120)
def test_a_warm_start_registry_a_conf_chooses_outside_the_dag_files_root_is_refused_before_anything(s3_client):
    """Whose champion a warm start reads is not data (issue 30): another team's registry, named whole by a conf, is
    refused before its champion is read and before any Ray job; under the DAG file's root, a conf's name is read."""
    other = f"s3://airflow-tune/other-team/models/{uuid.uuid4().hex[:8]}"
    bucket, prefix = split_s3_uri(other)
    secret = {"version": "v1", "value": 0.1, "metric": "loss", "mode": "min", "config": {"x": 9.5}}
    s3_client.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(secret).encode())
    run = run_dag(load_dag("aft_warm_start_from_conf", FILE), {"registry": other}, logical_date=_unique_date())
    assert run.task_states() == {"tune": "failed"}
    [error] = run.errors("tune")
    assert "warm_start = " in str(error) and "the DAG file did not write this registry" in str(error), error
    assert "9.5" not in str(error)
    assert jobs_of(experiment("aft_warm_start_from_conf", run.run_id)) == []


@pytest.mark.timeout(120)
def test_warm_start_from_a_config_dict_given_by_xcom(s3_client):
    run = run_dag(load_dag("aft_warm_start_xcom", FILE), logical_date=_unique_date())
    assert run.state == "success", (run.task_states(), run.errors("tune"))
    spec, manifest = _manifest(s3_client, run.xcom("tune"))
    assert spec["points_to_evaluate"] == [{"x": 7.25}]
    assert _first_trial(manifest) == {"x": 7.25, "steps": 1}
