"""Registries are code positions and belong to their DAG (issue 30), in DAGs run by ``dag.test()`` with a trigger
conf on the real stack (S3 endpoint, Ray jobs sealing each result): a conf that renders another team's registry, a
``..`` under a written root and a gate written as a template fail the promote task before anything is written, and
a second DAG writing the first DAG's registry is refused by its owner record with the champion unmoved; a registry
written in the DAG file, a name under a written root, a deployment's root and a threshold from a Param still
promote. The MLflow registry's cases are in tests/e2e/test_registry_mlflow.py (its server)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common.spec.naming import StorageURIError
from airflow_tune.operators.promote import split_s3_uri
from airflow_tune.registries.owner import OWNER_FILE, RegistryOwnerError
from airflow_tune.registries.promote_written import PromotionTargetError
from tests.e2e.dags.registry_owner_cases import TEAM_A_REGISTRY, TEAM_B_ROOT
from tests.e2e.helpers import DagTestRun, load_dag, run_dag
from tests.integration.test_promote import put_checkpoint, tune_result
from tests.support.sealed import sealed_result

pytestmark = pytest.mark.usefixtures("stack")

FILE = "registry_owner_cases.py"


def _unique_date() -> datetime:
    return datetime(2005, 5, 5, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _trigger(dag_id: str, s3: Any, loss: float, **conf: Any) -> DagTestRun:
    """A run of ``dag_id`` whose stand-in tune task returns a result sealed for that DAG (a fresh checkpoint)."""
    result = tune_result(put_checkpoint(s3, {"w.bin": f"{dag_id} {loss}".encode()}), loss, trial="best_00000")
    return run_dag(
        load_dag(dag_id, FILE), {"result": sealed_result(result, dag_id, run_id=None), **conf}, _unique_date()
    )


def _snapshot(s3: Any, registry: str) -> dict[str, bytes]:
    """Every object under the registry, with its bytes."""
    bucket, prefix = split_s3_uri(registry)
    found: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for obj in page.get("Contents", []):
            found[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return found


def _owner(s3: Any, registry: str) -> str:
    """The one DAG the registry's record names (these tests' registries each have one)."""
    bucket, prefix = split_s3_uri(registry)
    [dag_id] = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/{OWNER_FILE}")["Body"].read())["dags"]
    return str(dag_id)


def _failed(run: DagTestRun) -> BaseException:
    assert run.task_states() == {"tune": "success", "promote": "failed"}, (run.task_states(), run.errors("promote"))
    [error] = run.errors("promote")
    return error


def _team_a_champion(s3_client: Any) -> dict[str, bytes]:
    """Team A's registry with a champion of team A's (promoted now), as it stands."""
    promoted = _trigger("aft_owner_team_a", s3_client, 0.4)
    assert promoted.state == "success", (promoted.task_states(), promoted.errors("promote"))
    return _snapshot(s3_client, TEAM_A_REGISTRY)


@pytest.mark.timeout(240)
def test_a_conf_naming_another_team_s_registry_is_refused_before_any_write_and_that_registry_is_untouched(s3_client):
    before = _team_a_champion(s3_client)

    run = _trigger("aft_owner_team_b_conf", s3_client, 0.01, registry=TEAM_A_REGISTRY)
    error = _failed(run)
    assert isinstance(error, PromotionTargetError), error
    assert str(error).startswith(f"registry_uri = {TEAM_A_REGISTRY!r}: the DAG file did not write this registry")
    assert "the DAG file wrote no root" in str(error) and "allowed_storage_roots" in str(error)

    # Under team B's written root, a '..' that would reach team A's registry.
    escape = "../team-a/digits"
    run = _trigger("aft_owner_team_b_rooted", s3_client, 0.01, model=escape)
    error = _failed(run)
    assert isinstance(error, StorageURIError), error
    assert str(error).startswith(f"registry_uri = '{TEAM_B_ROOT}/{escape}'") and "'..'" in str(error)
    assert _snapshot(s3_client, TEAM_A_REGISTRY) == before


@pytest.mark.timeout(180)
def test_a_gate_written_as_a_template_is_not_rendered_and_is_refused(s3_client):
    run = _trigger("aft_owner_team_b_gate", s3_client, 9.0, gate="always")
    error = _failed(run)
    assert isinstance(error, PromotionTargetError), error
    assert str(error).startswith("gate = '{{ params.gate }}': gate is not a template field")
    assert _snapshot(s3_client, f"{TEAM_B_ROOT}/gated") == {}


@pytest.mark.timeout(240)
def test_a_second_dag_promoting_into_the_first_dag_s_registry_is_refused_and_the_champion_is_unmoved(s3_client):
    before = _team_a_champion(s3_client)
    champion = json.loads(before[f"{split_s3_uri(TEAM_A_REGISTRY)[1]}/champion.json"])

    run = _trigger("aft_owner_team_b_takes_a", s3_client, 0.001)  # a far better winner, gate "always"
    error = _failed(run)
    assert isinstance(error, RegistryOwnerError), error
    assert str(error).startswith(
        f"the registry {TEAM_A_REGISTRY} belongs to DAG(s) 'aft_owner_team_a': DAG 'aft_owner_team_b_takes_a' may not"
    )
    for value in (champion["version"], champion["experiment_uri"], champion["uri"]):
        assert str(value) not in str(error)  # the owner's DAG id, never a value of the registry
    assert _snapshot(s3_client, TEAM_A_REGISTRY) == before
    assert _owner(s3_client, TEAM_A_REGISTRY) == "aft_owner_team_a"  # written by its first promotion

    again = _trigger("aft_owner_team_a", s3_client, 0.3)  # the owner still promotes
    assert again.state == "success" and again.xcom("promote")["promoted"] is True


@pytest.mark.timeout(300)
def test_a_name_under_the_written_root_a_deployment_root_and_a_threshold_from_a_param_still_promote(
    s3_client, monkeypatch
):
    model = f"m-{uuid.uuid4().hex[:8]}"
    held = _trigger("aft_owner_team_b_rooted", s3_client, 0.7, model=model, threshold="0.5")
    assert held.state == "success", (held.task_states(), held.errors("promote"))
    assert held.xcom("promote")["promoted"] is False and "misses threshold 0.5 (min)" in held.xcom("promote")["reason"]
    assert _snapshot(s3_client, f"{TEAM_B_ROOT}/{model}") == {}, "a held-back winner writes nothing, not even an owner"

    promoted = _trigger("aft_owner_team_b_rooted", s3_client, 0.3, model=model, threshold="0.5")
    assert promoted.state == "success", (promoted.task_states(), promoted.errors("promote"))
    decision = promoted.xcom("promote")
    assert decision["promoted"] is True and decision["uri"].startswith(f"{TEAM_B_ROOT}/{model}/versions/")
    assert _owner(s3_client, f"{TEAM_B_ROOT}/{model}") == "aft_owner_team_b_rooted"

    # The deployment allows team B's root: a conf may then name any registry under it, and still not team A's.
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__ALLOWED_STORAGE_ROOTS", TEAM_B_ROOT)
    chosen = f"{TEAM_B_ROOT}/conf-{uuid.uuid4().hex[:8]}"
    run = _trigger("aft_owner_team_b_conf", s3_client, 0.2, registry=chosen)
    assert run.state == "success", (run.task_states(), run.errors("promote"))
    assert run.xcom("promote")["promoted"] is True and _owner(s3_client, chosen) == "aft_owner_team_b_conf"
    run = _trigger("aft_owner_team_b_conf", s3_client, 0.2, registry=TEAM_A_REGISTRY)
    assert "the deployment allows 1 root" in str(_failed(run))
