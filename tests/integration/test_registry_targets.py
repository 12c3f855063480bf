"""Registries are code positions and belong to their DAG (issue 30), through PromoteCheckpointOperator.execute()
against the real S3 endpoint, every S3 call observed (tests/integration/test_promote.py's hooks on boto3's default
session): a registry rendered from Params is refused before any S3 call at all; the first promotion writes the owner
record; another DAG's promotion reads the owner record and nothing else, writes nothing, and leaves the champion
as it was; a registry from before owner records is adopted by its first promotion (not by a held-back one)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.operators.promote import CHAMPION_FILE, PromoteCheckpointOperator, split_s3_uri
from airflow_tune.registries.owner import OWNER_FILE, RegistryOwnerError
from airflow_tune.registries.promote_written import PromotionTargetError
from tests.integration import test_promote
from tests.integration.test_promote import WRITES, put_checkpoint, registry_uri, run, seed_champion, tune_result
from tests.support.sealed import sealed_result

pytestmark = pytest.mark.usefixtures("stack")
s3_calls, reader = test_promote.s3_calls, test_promote.reader  # the S3 promotion tests' fixtures


def promote(
    dag_id: str, registry: str, result: dict[str, Any], params: dict[str, Any] | None = None, **kwargs: Any
) -> PromoteCheckpointOperator:
    """The operator of DAG ``dag_id`` (``result`` sealed for it), its template fields rendered by Airflow with
    ``params`` as a trigger conf would give them."""
    from airflow.sdk import DAG

    with DAG(dag_id, schedule=None, params=params or {}) as dag:
        op = PromoteCheckpointOperator(
            task_id="promote", result=sealed_result(result, dag_id), registry_uri=registry, **kwargs
        )
    ti = SimpleNamespace(dag_id=dag_id, task_id="promote", map_index=-1, try_number=1, start_date=None)
    context = {"params": params or {}, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op


def objects(client: Any, registry: str) -> dict[str, bytes]:
    bucket, prefix = split_s3_uri(registry)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def owner(client: Any, registry: str) -> str:
    bucket, prefix = split_s3_uri(registry)
    return str(json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/{OWNER_FILE}")["Body"].read())["dag_id"])


@pytest.mark.timeout(120)
def test_a_registry_rendered_from_params_naming_another_team_s_is_refused_before_any_s3_call(s3_calls, reader):
    theirs = registry_uri()
    out, _ = run(promote("aft_targets_team_a", theirs, tune_result(put_checkpoint(reader, {"w": b"a"}), 0.5)))
    assert out["promoted"] is True
    before = objects(reader, theirs)

    op = promote(
        "aft_targets_team_b",
        "{{ params.registry }}",
        tune_result(put_checkpoint(reader, {"w": b"b"}), 0.01),
        params={"registry": theirs},
        gate="always",
    )
    assert op.registry_uri == theirs
    s3_calls.clear()
    with pytest.raises(PromotionTargetError, match=f"^registry_uri = '{theirs}': the DAG file did not write"):
        run(op)
    assert s3_calls.events == [], "no S3 call at all, so certainly no write"
    assert objects(reader, theirs) == before


@pytest.mark.timeout(180)
def test_another_dag_reads_only_the_owner_record_writes_nothing_and_the_champion_stays(s3_calls, reader):
    registry = registry_uri()
    bucket, prefix = split_s3_uri(registry)
    first, _ = run(promote("aft_targets_owner", registry, tune_result(put_checkpoint(reader, {"w": b"1"}), 0.5)))
    assert first["promoted"] is True
    before = objects(reader, registry)

    intruder = promote("aft_targets_intruder", registry, tune_result(put_checkpoint(reader, {"w": b"2"}), 0.1))
    s3_calls.clear()
    with pytest.raises(RegistryOwnerError) as info:
        run(intruder)
    assert str(info.value).startswith(
        f"the registry {registry} belongs to DAG 'aft_targets_owner': DAG 'aft_targets_intruder' may not promote"
    )
    assert first["version"] not in str(info.value) and "0.5" not in str(info.value)
    registry_ops = [(op, key) for op, key in s3_calls.ops() if key and key.startswith(f"{prefix}/")]
    assert registry_ops == [("GetObject", f"{prefix}/{OWNER_FILE}")], "the owner record and nothing else"
    assert not {op for op, _ in s3_calls.ops()} & WRITES
    assert objects(reader, registry) == before
    record = json.loads(before[f"{prefix}/{OWNER_FILE}"])
    assert record["dag_id"] == "aft_targets_owner" and set(record) == {"dag_id", "claimed_at"}

    # The owner's retry of its own promotion and its next one go through.
    again, _ = run(promote("aft_targets_owner", registry, tune_result(put_checkpoint(reader, {"w": b"3"}), 0.2)))
    assert again["promoted"] is True and owner(reader, registry) == "aft_targets_owner"


@pytest.mark.timeout(180)
def test_a_registry_from_before_owner_records_is_adopted_by_its_first_promotion(s3_calls, reader):
    registry = registry_uri()
    bucket, prefix = split_s3_uri(registry)
    seeded = seed_champion(reader, registry, 1.0)

    held, _ = run(promote("aft_targets_adopter", registry, tune_result(put_checkpoint(reader, {"w": b"h"}), 2.0)))
    assert held["promoted"] is False
    assert objects(reader, registry) == {f"{prefix}/{CHAMPION_FILE}": seeded}, "held back: nothing written"

    s3_calls.clear()
    out, _ = run(promote("aft_targets_adopter", registry, tune_result(put_checkpoint(reader, {"w": b"p"}), 0.5)))
    assert out["promoted"] is True and owner(reader, registry) == "aft_targets_adopter"
    writes = [key for op, key in s3_calls.ops() if op in WRITES and key and key.startswith(f"{prefix}/")]
    assert writes[0] == f"{prefix}/{OWNER_FILE}" and writes[-1] == f"{prefix}/{CHAMPION_FILE}", writes

    with pytest.raises(RegistryOwnerError, match="belongs to DAG 'aft_targets_adopter'"):
        run(promote("aft_targets_late", registry, tune_result(put_checkpoint(reader, {"w": b"l"}), 0.1)))
    assert json.loads(objects(reader, registry)[f"{prefix}/{CHAMPION_FILE}"])["version"] == out["version"]


@pytest.mark.timeout(120)
def test_dags_that_write_the_same_registry_owner_share_a_registry_and_others_are_still_refused(reader):
    registry = registry_uri()
    first = promote(
        "aft_shared_retrain",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"1"}), 0.5),
        registry_owner="digits",
        gate="always",
    )
    assert run(first)[0]["promoted"] is True and owner(reader, registry) == "digits"
    second = promote(
        "aft_shared_from_ui",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"2"}), 0.4),
        registry_owner="digits",
        gate="always",
    )
    assert run(second)[0]["promoted"] is True
    stranger = promote(
        "aft_shared_stranger", registry, tune_result(put_checkpoint(reader, {"w": b"3"}), 0.1), gate="always"
    )
    with pytest.raises(RegistryOwnerError, match="belongs to DAG 'digits'.*registry_owner='digits'"):
        run(stranger)
