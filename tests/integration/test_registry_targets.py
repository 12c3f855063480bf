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
from tests.support.sealed import sealed_result, xcom_pull

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
    ti = SimpleNamespace(
        dag_id=dag_id, task_id="promote", map_index=-1, try_number=1, start_date=None, xcom_pull=xcom_pull
    )
    context = {"params": params or {}, "ti": ti, "task_instance": ti, "run_id": "manual__1", "dag": dag, "task": op}
    op.render_template_fields(context)  # type: ignore[arg-type]
    return op


def objects(client: Any, registry: str) -> dict[str, bytes]:
    bucket, prefix = split_s3_uri(registry)
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed}


def owner(client: Any, registry: str) -> dict[str, list[str]]:
    """The registry's record: each DAG that promoted into it and the DAGs its file shares it with."""
    bucket, prefix = split_s3_uri(registry)
    return dict(json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}/{OWNER_FILE}")["Body"].read())["dags"])


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
        f"the registry {registry} belongs to DAG(s) 'aft_targets_owner': DAG 'aft_targets_intruder' may not use it"
    )
    assert first["version"] not in str(info.value) and "0.5" not in str(info.value)
    registry_ops = [(op, key) for op, key in s3_calls.ops() if key and key.startswith(f"{prefix}/")]
    assert registry_ops == [("GetObject", f"{prefix}/{OWNER_FILE}")], "the owner record and nothing else"
    assert not {op for op, _ in s3_calls.ops()} & WRITES
    assert objects(reader, registry) == before
    record = json.loads(before[f"{prefix}/{OWNER_FILE}"])
    assert record["dags"] == {"aft_targets_owner": ["aft_targets_owner"]} and set(record) == {"dags", "updated_at"}

    # The owner's retry of its own promotion and its next one go through.
    again, _ = run(promote("aft_targets_owner", registry, tune_result(put_checkpoint(reader, {"w": b"3"}), 0.2)))
    assert again["promoted"] is True and owner(reader, registry) == {"aft_targets_owner": ["aft_targets_owner"]}


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
    assert out["promoted"] is True and owner(reader, registry) == {"aft_targets_adopter": ["aft_targets_adopter"]}
    writes = [key for op, key in s3_calls.ops() if op in WRITES and key and key.startswith(f"{prefix}/")]
    assert writes[0] == f"{prefix}/{OWNER_FILE}" and writes[-1] == f"{prefix}/{CHAMPION_FILE}", writes

    with pytest.raises(RegistryOwnerError, match=r"belongs to DAG\(s\) 'aft_targets_adopter'"):
        run(promote("aft_targets_late", registry, tune_result(put_checkpoint(reader, {"w": b"l"}), 0.1)))
    assert json.loads(objects(reader, registry)[f"{prefix}/{CHAMPION_FILE}"])["version"] == out["version"]


@pytest.mark.timeout(180)
def test_dags_that_list_each_other_share_a_registry_and_a_dag_file_that_lists_itself_in_is_refused(reader):
    registry = registry_uri()
    shared = ["aft_shared_retrain", "aft_shared_from_ui"]
    first = promote(
        "aft_shared_retrain",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"1"}), 0.5),
        registry_dags=shared,
        gate="always",
    )
    assert run(first)[0]["promoted"] is True
    assert owner(reader, registry) == {"aft_shared_retrain": sorted(shared)}
    second = promote(
        "aft_shared_from_ui",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"2"}), 0.4),
        registry_dags=shared,
        gate="always",
    )
    assert run(second)[0]["promoted"] is True
    assert owner(reader, registry) == {"aft_shared_retrain": sorted(shared), "aft_shared_from_ui": sorted(shared)}
    # Another DAG file writes the registry and lists itself with the two: they do not list it, so it is refused
    # (before, a DAG file that wrote the same registry_owner name got in).
    stranger = promote(
        "aft_shared_stranger",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"3"}), 0.1),
        registry_dags=[*shared, "aft_shared_stranger"],
        gate="always",
    )
    with pytest.raises(
        RegistryOwnerError,
        match=r"belongs to DAG\(s\) 'aft_shared_from_ui', 'aft_shared_retrain': DAG 'aft_shared_stranger' may not",
    ):
        run(stranger)
    assert set(owner(reader, registry)) == set(shared), "the refused DAG recorded nothing"


def test_registry_owner_the_free_text_name_is_refused_at_parse_naming_the_fix():
    from airflow.sdk import DAG

    with DAG("aft_owner_name", schedule=None), pytest.raises(TypeError, match="registry_dags=\\["):
        PromoteCheckpointOperator(task_id="promote", result={}, registry_uri="s3://b/models/x", registry_owner="digits")


@pytest.mark.timeout(180)
def test_a_champion_pointed_at_another_dag_s_sealed_checkpoint_is_refused_at_load(reader):
    """A writer of the registry's prefix points champion.json at a checkpoint another DAG's experiment sealed (its
    proof is real): the load believes only versions whose experiment ran for one of the registry's DAGs."""
    from airflow_tune.exceptions import PromotionError
    from airflow_tune.registry import champion_checkpoint

    registry, elsewhere = registry_uri(), registry_uri()
    ours, _ = run(promote("aft_load_owner", registry, tune_result(put_checkpoint(reader, {"w": b"o"}), 0.5)))
    theirs, _ = run(promote("aft_load_other", elsewhere, tune_result(put_checkpoint(reader, {"w": b"t"}), 0.4)))
    assert ours["promoted"] and theirs["promoted"]
    assert champion_checkpoint(registry, s3=reader)[0].startswith(registry + "/versions/")
    bucket, prefix = split_s3_uri(registry)
    _, other_prefix = split_s3_uri(elsewhere)
    pointer = reader.get_object(Bucket=bucket, Key=f"{other_prefix}/{CHAMPION_FILE}")["Body"].read()
    forged = json.loads(pointer)
    forged["uri"] = forged["uri"].replace(elsewhere, registry)  # the copy "inside" this registry, as a writer would
    reader.put_object(Bucket=bucket, Key=f"{prefix}/{CHAMPION_FILE}", Body=json.dumps(forged).encode())
    with pytest.raises(PromotionError, match="ran for DAG 'aft_load_other', which is not one of the registry's DAGs"):
        champion_checkpoint(registry, s3=reader)


@pytest.mark.timeout(180)
def test_the_deployment_s_registry_dags_decide_for_the_registries_it_names(reader, monkeypatch):
    registry = registry_uri()
    first, _ = run(promote("aft_deployed_first", registry, tune_result(put_checkpoint(reader, {"w": b"1"}), 0.5)))
    assert first["promoted"] is True and owner(reader, registry) == {"aft_deployed_first": ["aft_deployed_first"]}
    monkeypatch.setenv(
        "AIRFLOW__AIRFLOW_TUNE__REGISTRY_DAGS", json.dumps({registry: ["aft_deployed_first", "aft_deployed_second"]})
    )
    # Listed by the deployment: promotes though the registry's record does not list it.
    second = promote(
        "aft_deployed_second", registry, tune_result(put_checkpoint(reader, {"w": b"2"}), 0.4), gate="always"
    )
    assert run(second)[0]["promoted"] is True
    # Not listed by the deployment: refused, whatever its DAG file lists.
    third = promote(
        "aft_deployed_third",
        registry,
        tune_result(put_checkpoint(reader, {"w": b"3"}), 0.1),
        registry_dags=["aft_deployed_first", "aft_deployed_second"],
        gate="always",
    )
    with pytest.raises(RegistryOwnerError, match=r"the deployment's \[airflow_tune\] registry_dags lists"):
        run(third)
