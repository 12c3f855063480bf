"""A registry belongs to DAGs by id (issues 30 and 40): the rules, and the claims' races against stand-in clients
that answer as S3 and MLflow do (the real S3 endpoint and MLflow server: tests/integration/test_registry_targets.py
and tests/e2e/test_registry_mlflow.py)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries.mlflow import MLflowRegistry
from airflow_tune.registries.owner import (
    DAGS_TAG,
    OWNER_FILE,
    OWNER_TAG,
    Claim,
    RegistryOwnerError,
    allowed_dags,
    claim_mlflow,
    claim_s3,
    dags_of,
    decide,
    record_of,
)

REGISTRY = "s3://ml-bucket/models/digits"
KEY = f"models/digits/{OWNER_FILE}"


def claim(dag_id: str, *shares_with: str, deployment: list[str] | None = None) -> Claim:
    return Claim.of(dag_id, shares_with, deployment)


def test_no_record_is_adopted_the_owner_passes_and_another_dag_is_refused_naming_only_registry_and_dags():
    assert decide(REGISTRY, None, claim("team_a")) is False
    assert decide(REGISTRY, {"team_a": ["team_a"]}, claim("team_a")) is True
    with pytest.raises(RegistryOwnerError) as info:
        decide(REGISTRY, {"team_a": ["team_a"]}, claim("team_b", "team_a"))
    assert str(info.value).startswith(
        f"the registry {REGISTRY} belongs to DAG(s) 'team_a': DAG 'team_b' may not use it"
    )
    assert "add 'team_b' to registry_dags in those DAG files" in str(info.value)
    assert isinstance(info.value, PromotionError)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


def test_a_dag_shares_a_registry_only_when_every_dag_in_it_lists_it():
    record = {"retrain": ["retrain", "ui"]}
    assert allowed_dags(record) == {"retrain", "ui"}
    assert decide(REGISTRY, record, claim("ui", "retrain")) is False  # admitted; its own list is recorded next
    record["ui"] = ["retrain", "ui"]
    assert decide(REGISTRY, record, claim("ui", "retrain")) is True
    # A third DAG file that lists itself and the others is still refused: the DAGs already there do not list it.
    with pytest.raises(RegistryOwnerError, match=r"belongs to DAG\(s\) 'retrain', 'ui': DAG 'stranger' may not"):
        decide(REGISTRY, record, claim("stranger", "retrain", "ui"))
    # Once one of them lists it and the other does not, it is still refused; when both do, it is admitted.
    record["retrain"] = ["retrain", "stranger", "ui"]
    with pytest.raises(RegistryOwnerError):
        decide(REGISTRY, record, claim("stranger", "retrain", "ui"))
    record["ui"] = ["retrain", "stranger", "ui"]
    assert decide(REGISTRY, record, claim("stranger", "retrain", "ui")) is False


def test_the_deployment_s_list_decides_alone_for_the_registries_it_names():
    record = {"retrain": ["retrain"]}
    assert decide(REGISTRY, record, claim("ui", deployment=["retrain", "ui"])) is False
    with pytest.raises(RegistryOwnerError, match="the deployment's \\[airflow_tune\\] registry_dags lists"):
        decide(REGISTRY, None, claim("retrain", "stranger", deployment=["ui"]))


def test_a_load_believes_the_dags_of_the_deployment_or_the_record(monkeypatch):
    monkeypatch.delenv("AIRFLOW__AIRFLOW_TUNE__REGISTRY_DAGS", raising=False)
    assert dags_of(REGISTRY, {"a": ["a", "b"], "b": ["a", "b", "c"]}) == {"a", "b"}
    assert dags_of(REGISTRY, None) == set()
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__REGISTRY_DAGS", json.dumps({REGISTRY: ["x"], "models:/other": ["y"]}))
    assert dags_of(REGISTRY, {"a": ["a"]}) == {"x"}
    assert dags_of("s3://ml-bucket/models/elsewhere", {"a": ["a"]}) == {"a"}
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TUNE__REGISTRY_DAGS", '["x"]')
    with pytest.raises(ValueError, match="must be a JSON object of registry URIs to lists of DAG ids"):
        dags_of(REGISTRY, None)


@pytest.mark.parametrize(
    "body", [b"not json", b"[]", b"{}", b'{"dag_id": ""}', b'{"dag_id": 3}', b'{"dags": {}}', b'{"dags": {"a": "a"}}']
)
def test_a_record_we_did_not_write_is_refused(body):
    with pytest.raises(PromotionError, match=f"has an owner record \\({OWNER_FILE}\\) that names no DAG"):
        record_of(REGISTRY, body)
    assert record_of(REGISTRY, b'{"dags": {"a": ["b", "a", "a"]}}') == {"a": ["a", "b"]}


def test_a_record_from_before_names_a_free_text_owner_that_admits_only_a_dag_of_that_id():
    record = record_of(REGISTRY, b'{"dag_id": "digits", "claimed_at": "x"}')
    assert record == {"digits": ["digits"]}
    with pytest.raises(RegistryOwnerError, match="belongs to DAG\\(s\\) 'digits': DAG 'digits_retrain_weekly'"):
        decide(REGISTRY, record, claim("digits_retrain_weekly", "digits"))


class _ClientError(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


class FakeS3:
    """get_object/put_object with S3's answers: NoSuchKey, and If-None-Match: * refused with PreconditionFailed
    (or NotImplemented, as a store without conditional writes); ``before_put`` runs just before a put lands."""

    def __init__(self, conditional: bool = True) -> None:
        self.objects: dict[str, bytes] = {}
        self.conditional = conditional
        self.before_put: Any = None

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803 - boto3's names
        if Key not in self.objects:
            raise _ClientError("NoSuchKey")
        return {"Body": SimpleNamespace(read=lambda: self.objects[Key])}

    def put_object(self, Bucket: str, Key: str, Body: bytes, **kwargs: Any) -> None:  # noqa: N803
        if self.before_put is not None:
            self.before_put, hook = None, self.before_put
            hook(self)
        if "IfNoneMatch" in kwargs:
            if not self.conditional:
                raise _ClientError("NotImplemented")
            if Key in self.objects:
                raise _ClientError("PreconditionFailed")
        self.objects[Key] = Body


def test_a_claim_writes_the_record_once_and_a_dag_that_lost_the_race_is_refused():
    s3 = FakeS3()
    claim_s3(s3, REGISTRY, claim("team_a"))
    assert json.loads(s3.objects[KEY])["dags"] == {"team_a": ["team_a"]}
    first = s3.objects[KEY]
    claim_s3(s3, REGISTRY, claim("team_a"))  # already recorded: nothing written
    assert s3.objects[KEY] is first

    raced = FakeS3()
    raced.before_put = lambda s3: s3.objects.__setitem__(KEY, b'{"dags": {"team_b": ["team_b"]}}')
    with pytest.raises(RegistryOwnerError, match="belongs to DAG\\(s\\) 'team_b': DAG 'team_a' may not"):
        claim_s3(raced, REGISTRY, claim("team_a", "team_b"))
    assert json.loads(raced.objects[KEY])["dags"] == {"team_b": ["team_b"]}


def test_a_claim_records_a_dag_s_changed_list_and_a_dag_the_winner_of_a_race_lists_gets_in():
    s3 = FakeS3()
    claim_s3(s3, REGISTRY, claim("retrain", "ui"))
    claim_s3(s3, REGISTRY, claim("ui", "retrain"))
    assert json.loads(s3.objects[KEY])["dags"] == {"retrain": ["retrain", "ui"], "ui": ["retrain", "ui"]}

    raced = FakeS3()
    raced.before_put = lambda s3: s3.objects.__setitem__(KEY, b'{"dags": {"retrain": ["retrain", "ui"]}}')
    claim_s3(raced, REGISTRY, claim("ui", "retrain"))
    assert json.loads(raced.objects[KEY])["dags"] == {"retrain": ["retrain", "ui"], "ui": ["retrain", "ui"]}


def test_a_store_without_conditional_writes_still_gets_the_record_and_reads_it_back():
    s3 = FakeS3(conditional=False)
    claim_s3(s3, REGISTRY, claim("team_a"))
    assert json.loads(s3.objects[KEY])["dags"] == {"team_a": ["team_a"]}


class _MlflowException(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.error_code = code


class FakeMlflow:
    """The registered-model calls the claim makes, answering as MlflowClient does."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, str]] = {}
        self.before_create: Any = None

    def get_registered_model(self, name: str) -> Any:
        if name not in self.models:
            raise _MlflowException("RESOURCE_DOES_NOT_EXIST")
        return SimpleNamespace(name=name, tags=dict(self.models[name]))

    def create_registered_model(self, name: str, tags: dict[str, str] | None = None) -> None:
        if self.before_create is not None:
            self.before_create(self)
        if name in self.models:
            raise _MlflowException("RESOURCE_ALREADY_EXISTS")
        self.models[name] = dict(tags or {})

    def set_registered_model_tag(self, name: str, key: str, value: str) -> None:
        self.models[name][key] = value


@pytest.mark.parametrize(
    ("existing", "created_meanwhile", "admitted"),
    [
        (None, None, True),  # a new model, created with its record
        ({}, None, True),  # a model from before owners: adopted
        ({"team": "ml"}, None, True),
        (None, {}, True),  # created without a tag meanwhile: adopted
        (None, {DAGS_TAG: '{"dags": {"team_b": ["team_b"]}}'}, False),  # another DAG's promotion created it meanwhile
        ({DAGS_TAG: '{"dags": {"team_b": ["team_b"]}}'}, None, False),
        ({OWNER_TAG: "team_b"}, None, False),  # a record from before, naming another owner
        ({DAGS_TAG: '{"dags": {"team_b": ["team_a", "team_b"]}}'}, None, True),  # team_b's DAG file lists team_a
    ],
)
def test_an_mlflow_claim_creates_or_adopts_the_model_and_refuses_a_dag_not_listed(
    existing, created_meanwhile, admitted
):
    client = FakeMlflow()
    if existing is not None:
        client.models["digits"] = dict(existing)
    if created_meanwhile is not None:
        client.before_create = lambda c: c.models.setdefault("digits", dict(created_meanwhile))
    registry = MLflowRegistry(client, "digits", "http://mlflow:5000")
    if admitted:
        claim_mlflow(registry, claim("team_a", "team_b"))
        recorded = json.loads(client.models["digits"][DAGS_TAG])["dags"]
        assert recorded["team_a"] == ["team_a", "team_b"]
    else:
        with pytest.raises(RegistryOwnerError, match="the registry models:/digits belongs to DAG\\(s\\) 'team_b'"):
            claim_mlflow(registry, claim("team_a", "team_b"))
        assert client.models["digits"] == (existing if existing is not None else created_meanwhile)
