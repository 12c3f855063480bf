"""The deploy helpers verify a promoted version against Airflow's own record of its promotion (issue 40), on the real
stack (Ray head, S3 endpoint, MLflow server, ``dag.test()``): the promote task's XCom (``registered_files``, the digest
of every file it wrote) and the registry's Asset event (their ``files_digest``, its source task instance).

A writer of the S3 registry's prefix, or of MLflow's tags and the version folder, swaps the model's loader
(``python_model.pkl``, a pickle that would create a marker file when unpickled) and recomputes every digest the
registry stores beside the files (``champion.json``, ``model.json``, ``registered.json``, the
``airflow_tune.model_digest`` tag): the helper given the promote task's XCom, or the Asset event, or run inside an
Airflow task with neither (it pulls the promote task's XCom itself), refuses before anything is unpickled, naming the
file. An Asset event created the way Airflow's REST API creates one (no source task) is not a promotion. The marker
never appears. The same record lets the legitimate loads through.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.common.provenance import files_digest
from airflow_tune.exceptions import PromotionError
from tests.e2e.dags.promotion_record_cases import MLFLOW_REGISTRY, S3_REGISTRY
from tests.e2e.helpers import load_dag, run_dag
from tests.integration.test_promote import put_checkpoint, tune_result
from tests.support.mlflow_server import MlflowRest, mlflow_beside
from tests.support.sealed import sealed_result

FILE = "promotion_record_cases.py"
REFUSED = r"not the ones its promotion registered as Airflow recorded it \(changed: 'python_model.pkl'\)"
MAP_REWRITTEN = r"registered.json is missing or is not the map of files its promotion registered"


class _Planted:
    """Unpickled, it creates the file its path names: the proof that an attacker's pickle ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def mlflow_url(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_beside(stack, tmp_path_factory.mktemp("mlflow-record")) as url:
        yield url


@pytest.fixture
def s3(stack: Any) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=stack.s3_endpoint, region_name="us-east-1")


def _date() -> datetime:
    return datetime(2027, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=uuid.uuid4().int % 10**8)


def _promote(dag_id: str, s3: Any, scale: float) -> tuple[Any, dict[str, Any]]:
    source = put_checkpoint(s3, {"weights.json": json.dumps({"scale": scale}).encode()})
    result = sealed_result({**tune_result(source, 0.1), "mlflow": None}, dag_id, run_id=None)
    ran = run_dag(load_dag(dag_id, FILE), {"result": result}, logical_date=_date())
    assert ran.state == "success", (ran.task_states(), ran.errors("promote"))
    decision = ran.xcom("promote")
    assert decision["promoted"] is True and decision["registered_files"], decision
    return ran, decision


def asset_event(dag_id: str, run_id: str) -> Any:
    """The promotion's Asset event as Airflow recorded it, in the form a task's ``triggering_asset_events`` hands
    over (built from the database row, as Airflow's execution API builds it)."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        [row] = session.scalars(
            select(AssetEvent).where(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == run_id)
        ).all()
        return _as_task_sees_it(row)


def _as_task_sees_it(row: Any) -> Any:
    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult

    return AssetEventDagRunReferenceResult(
        asset={"name": row.asset.name, "uri": row.asset.uri, "extra": {}},
        extra=dict(row.extra or {}),
        source_task_id=row.source_task_id,
        source_dag_id=row.source_dag_id,
        source_run_id=row.source_run_id,
        source_map_index=row.source_map_index,
        source_aliases=[],
        timestamp=row.timestamp,
    )


def rest_api_event(registry: str, extra: dict[str, Any]) -> Any:
    """An Asset event of ``registry`` created as Airflow's REST API creates one (``POST /api/v2/assets/events``:
    ``AssetManager.register_asset_change`` with ``source_is_api``, no task instance), carrying ``extra``."""
    from airflow.api_fastapi.core_api.datamodels.assets import CreateAssetEventsBody
    from airflow.assets.manager import AssetManager
    from airflow.models.asset import AssetModel
    from airflow.utils import timezone as airflow_timezone
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        asset = session.scalar(select(AssetModel).where(AssetModel.uri == registry))
        assert asset is not None, registry
        body = CreateAssetEventsBody(asset_id=asset.id, extra=extra)
        event = AssetManager.register_asset_change(
            asset=asset, timestamp=airflow_timezone.utcnow(), extra=body.extra, source_is_api=True, session=session
        )
        session.flush()
        return _as_task_sees_it(event)


def _put(s3: Any, uri: str, body: bytes) -> None:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    s3.put_object(Bucket=bucket, Key=key, Body=body)


def _get(s3: Any, uri: str) -> bytes:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def swap_loader(s3: Any, folder: str, marker: Path) -> str:
    """Replace the model's loader in ``folder`` with a planted pickle and recompute the map the folder keeps
    (``registered.json``); returns the new digest of the model's files, for the registry's other records."""
    from airflow_tune.registries.mlflow_model import model_digest

    planted = pickle.dumps(_Planted(str(marker)))
    _put(s3, f"{folder}/python_model.pkl", planted)
    stored = json.loads(_get(s3, f"{folder}/registered.json"))
    files = dict(stored["registered_files"])
    files["python_model.pkl"] = "sha256:" + hashlib.sha256(planted).hexdigest()
    stored.update({"registered_files": files, "files_digest": files_digest(files)})
    _put(s3, f"{folder}/registered.json", json.dumps(stored).encode())
    return model_digest(files)


def _refused(call: Any, marker: Path, pattern: str = REFUSED) -> PromotionError:
    with pytest.raises(PromotionError) as refused:
        call()
    assert re.search(pattern, str(refused.value)), refused.value
    assert not marker.exists(), "the planted pickle ran"
    return refused.value


@pytest.mark.timeout(420)
def test_an_s3_registry_writer_who_swaps_the_loader_and_recomputes_the_stored_digests_is_refused(s3, tmp_path):
    from airflow_tune.checkpoints import download_checkpoint, download_model

    ran, decision = _promote("aft_record_s3", s3, 2.0)
    event = asset_event("aft_record_s3", ran.run_id)
    folder = decision["version_folder"]
    assert event.extra["files_digest"] == decision["files_digest"] and event.extra["version_folder"] == folder
    # The legitimate loads: by the XCom, by the event, and inside a deploy task that finds the record itself.
    assert Path(download_model(S3_REGISTRY, str(tmp_path / "ok"), promotion=decision), "python_model.pkl").exists()
    assert Path(download_model(S3_REGISTRY, str(tmp_path / "ok2"), promotion=event), "MLmodel").exists()
    for dag_id, task_id in (("aft_record_deploy_s3", "deploy"), ("aft_record_deploy_s3_event", "deploy_event")):
        deployed = run_dag(load_dag(dag_id, FILE), None, logical_date=_date())
        assert deployed.state == "success", deployed.errors(task_id)
        assert "python_model.pkl" in deployed.xcom(task_id) and "registered.json" not in deployed.xcom(task_id)

    # The prefix writer: a planted loader, and every digest stored in the registry recomputed to match it.
    marker = tmp_path / "attacker-ran"
    digest = swap_loader(s3, folder, marker)
    for pointer in (f"{S3_REGISTRY}/champion.json",):
        body = json.loads(_get(s3, pointer))
        _put(s3, pointer, json.dumps({**body, "mlflow_model_digest": digest}).encode())
    card = json.loads(_get(s3, f"{folder}/model.json"))
    card["mlflow_model"]["digest"] = digest
    _put(s3, f"{folder}/model.json", json.dumps(card).encode())

    # Complete: what the registry stores agrees with the planted files, so a script outside Airflow with no record,
    # which can only check those (and says so in a warning), takes them; nothing here unpickles them.
    download_model(S3_REGISTRY, str(tmp_path / "unanchored"))
    _refused(lambda: download_model(S3_REGISTRY, str(tmp_path / "x"), promotion=decision), marker)
    # The event alone carries the digest of the map, not the map: outside a task the folder's (rewritten) copy of
    # it is refused; inside a task the map comes from the event's own promote task instance, and the file is named.
    _refused(lambda: download_model(S3_REGISTRY, str(tmp_path / "e"), promotion=event), marker, MAP_REWRITTEN)
    for dag_id, task_id in (("aft_record_deploy_s3", "deploy"), ("aft_record_deploy_s3_event", "deploy_event")):
        refused = run_dag(load_dag(dag_id, FILE), None, logical_date=_date())
        assert refused.task_states() == {task_id: "failed"}
        [error] = refused.errors(task_id)
        assert isinstance(error, PromotionError) and re.search(REFUSED, str(error)), error
    # The checkpoint itself is untouched: it still loads by the record.
    assert Path(
        download_checkpoint(f"{folder}/checkpoint", str(tmp_path / "c"), promotion=decision), "weights.json"
    ).exists()
    assert not marker.exists() and not (tmp_path / "x").exists() and not (tmp_path / "e").exists()


@pytest.mark.timeout(420)
def test_an_mlflow_tag_writer_who_swaps_the_loader_and_rewrites_the_model_digest_tag_is_refused(
    mlflow_url, s3, tmp_path
):
    from airflow_tune.checkpoints import download_model

    ran, decision = _promote("aft_record_mlflow", s3, 3.0)
    event = asset_event("aft_record_mlflow", ran.run_id)
    name, folder = MLFLOW_REGISTRY.removeprefix("models:/"), decision["version_folder"]
    assert Path(download_model(MLFLOW_REGISTRY, str(tmp_path / "ok"), promotion=event), "MLmodel").exists()
    deployed = run_dag(load_dag("aft_record_deploy_mlflow", FILE), None, logical_date=_date())
    assert deployed.state == "success", deployed.errors("deploy")

    marker = tmp_path / "attacker-ran"
    digest = swap_loader(s3, folder, marker)
    rest = MlflowRest(mlflow_url)
    for key in ("airflow_tune.model_digest", "airflow_tune.files_digest"):
        rest.post("model-versions/set-tag", {"name": name, "version": decision["version"], "key": key, "value": digest})

    download_model(f"{MLFLOW_REGISTRY}@champion", str(tmp_path / "unanchored"))  # the tags agree with the plant
    _refused(lambda: download_model(MLFLOW_REGISTRY, str(tmp_path / "x"), promotion=decision), marker)
    _refused(
        lambda: download_model(f"{MLFLOW_REGISTRY}@champion", str(tmp_path / "e"), promotion=event),
        marker,
        MAP_REWRITTEN,
    )
    refused = run_dag(load_dag("aft_record_deploy_mlflow", FILE), None, logical_date=_date())
    assert refused.task_states() == {"deploy": "failed"}
    [error] = refused.errors("deploy")
    assert isinstance(error, PromotionError) and re.search(REFUSED, str(error)), error
    assert not marker.exists()


@pytest.mark.timeout(300)
def test_an_asset_event_made_through_the_rest_api_or_by_another_dag_is_not_a_promotion(s3, tmp_path):
    from airflow_tune.checkpoints import download_model

    ran, decision = _promote("aft_record_s3", s3, 4.0)
    genuine = asset_event("aft_record_s3", ran.run_id)
    # A user who may create Asset events (not run a promote task) copies a genuine event's extra.
    forged = rest_api_event(S3_REGISTRY, dict(genuine.extra))
    assert forged.source_task_id is None and forged.extra.get("from_rest_api") is True
    _refused(
        lambda: download_model(S3_REGISTRY, str(tmp_path / "api"), promotion=forged),
        tmp_path / "none",
        r"was not made by a promote task \(it has no source task instance: it was created through the REST API",
    )
    # An event from a task of a DAG that is not one of the registry's.
    other = genuine.model_copy(update={"source_dag_id": "aft_someone_else"})
    _refused(
        lambda: download_model(S3_REGISTRY, str(tmp_path / "other"), promotion=other),
        tmp_path / "none",
        r"DAG 'aft_someone_else' is not one of the registry s3://airflow-tune/models/aft-e2e-record's DAGs "
        r"\('aft_record_s3'\)",
    )
    assert not (tmp_path / "api").exists() and not (tmp_path / "other").exists()
    assert Path(download_model(S3_REGISTRY, str(tmp_path / "ok"), promotion=genuine), "MLmodel").exists()
