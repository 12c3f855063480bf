"""Which records of a promotion the deploy helpers believe (:mod:`airflow_tune.registries.record`): pure logic on the
promote task's XCom and on Asset events in the form a task sees them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common.provenance import files_digest
from airflow_tune.exceptions import PromotionError
from airflow_tune.registries import record

pytestmark = pytest.mark.unit

REGISTRY = "s3://bucket/models/digits"
FOLDER = f"{REGISTRY}/versions/v1"
FILES = {"MLmodel": "sha256:aa", "python_model.pkl": "sha256:bb", "checkpoint/w.bin": "sha256:cc"}
BY = {"dag_id": "retrain", "run_id": "r1", "task_id": "promote", "map_index": -1}


def xcom(**changes: Any) -> dict[str, Any]:
    base = {
        "promoted": True,
        "version": "v1",
        "registry": REGISTRY,
        "version_folder": FOLDER,
        "registered_files": FILES,
        "files_digest": files_digest(FILES),
        "promoted_by": BY,
    }
    return {**base, **changes}


def event(**changes: Any) -> Any:
    from airflow.sdk.execution_time.comms import AssetEventDagRunReferenceResult

    fields = {
        "asset": {"name": REGISTRY, "uri": REGISTRY, "extra": {}},
        "extra": record.event_extra(REGISTRY, "v1", FOLDER, FILES) | {"version": "v1"},
        "source_task_id": "promote",
        "source_dag_id": "retrain",
        "source_run_id": "r1",
        "source_map_index": -1,
        "source_aliases": [],
        "timestamp": datetime(2026, 1, 1, tzinfo=timezone.utc),
    }
    return AssetEventDagRunReferenceResult(**{**fields, **changes})


def test_the_promote_task_s_xcom_and_its_asset_event_are_the_same_promotion():
    from_xcom = record.of(xcom(), REGISTRY, {"retrain"})
    from_event = record.of(event(), REGISTRY + "/", {"retrain"})
    assert (from_xcom.version, from_xcom.folder, from_xcom.digest) == ("v1", FOLDER, files_digest(FILES))
    assert (from_event.version, from_event.folder, from_event.digest) == ("v1", FOLDER, files_digest(FILES))
    assert from_xcom.files == FILES and from_event.files is None
    assert from_event.promoted_by == BY
    assert record.part(FILES, "checkpoint") == {"w.bin": "sha256:cc"} and record.part(FILES, "") == FILES


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"source_task_id": None, "source_dag_id": None, "source_run_id": None}, "created through the REST API"),
        ({"source_dag_id": "someone_else"}, "DAG 'someone_else' is not one of the registry"),
        ({"asset": {"name": "x", "uri": "s3://bucket/models/other", "extra": {}}}, "another asset"),
        ({"extra": {"version": "v1"}}, "names no version, version folder or files_digest"),
    ],
)
def test_an_asset_event_no_promote_task_of_the_registry_made_is_refused(changes, words):
    with pytest.raises(PromotionError, match=words):
        record.of(event(**changes), REGISTRY, {"retrain"})


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"promoted": False, "reason": "held back"}, "did not promote"),
        ({"promoted_by": None}, "names no promote task instance"),
        ({"registered_files": {**FILES, "extra.py": "sha256:dd"}}, "holds no registered_files whose digest"),
        ({"registry": "models:/digits"}, "is a promotion into models:/digits, not into"),
        ({"promoted_by": {**BY, "dag_id": "other"}}, "DAG 'other' is not one of the registry"),
    ],
)
def test_an_xcom_that_is_no_promotion_of_the_registry_is_refused(changes, words):
    with pytest.raises(PromotionError, match=words):
        record.of(xcom(**changes), REGISTRY, {"retrain"})


def test_the_version_folder_s_map_is_believed_only_through_the_record_s_digest_and_differences_are_named():
    import json

    given = record.of(event(), REGISTRY, {"retrain"})
    stored = json.dumps({"registered_files": FILES}).encode()
    assert record.expected_files(given, stored) == FILES
    recomputed = {**FILES, "python_model.pkl": "sha256:ee"}
    with pytest.raises(PromotionError, match="registered.json is missing or is not the map"):
        record.expected_files(given, json.dumps({"registered_files": recomputed}).encode())
    with pytest.raises(PromotionError, match=r"changed: 'python_model.pkl'; missing: 'MLmodel'; not written .*'x.py'"):
        found = {k: v for k, v in recomputed.items() if k != "MLmodel"} | {"x.py": "sha256:ff"}
        record.verify(FILES, found, "version v1", FOLDER)
    with pytest.raises(TypeError, match="give the promote task's XCom"):
        record.of("v1", REGISTRY, {"retrain"})
