"""A registry records the DAG that owns it (issue 30): the rules, and the claims' races against stand-in clients
that answer as S3 and MLflow do (the real S3 endpoint and MLflow server: tests/integration/test_registry_targets.py
and tests/e2e/test_registry_owner_mlflow.py)."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries.mlflow import MLflowRegistry
from airflow_tune.registries.owner import (
    OWNER_FILE,
    OWNER_TAG,
    RegistryOwnerError,
    claim_mlflow,
    claim_s3,
    decide,
    owner_of_record,
)

REGISTRY = "s3://ml-bucket/models/digits"


def test_no_owner_is_adopted_the_owner_passes_and_another_dag_is_refused_naming_only_registry_and_owner():
    assert decide(REGISTRY, None, "team_a") is False
    assert decide(REGISTRY, "team_a", "team_a") is True
    with pytest.raises(RegistryOwnerError) as info:
        decide(REGISTRY, "team_a", "team_b")
    assert str(info.value).startswith(
        f"the registry {REGISTRY} belongs to DAG 'team_a': DAG 'team_b' may not promote into it"
    )
    assert isinstance(info.value, PromotionError)
    assert pickle.loads(pickle.dumps(info.value)).args == info.value.args


@pytest.mark.parametrize("body", [b"not json", b"[]", b"{}", b'{"dag_id": ""}', b'{"dag_id": 3}'])
def test_an_owner_record_we_did_not_write_is_refused(body):
    with pytest.raises(PromotionError, match=f"has an owner record \\({OWNER_FILE}\\) that names no DAG"):
        owner_of_record(REGISTRY, body)
    assert owner_of_record(REGISTRY, b'{"dag_id": "team_a", "claimed_at": "x"}') == "team_a"


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


def test_a_claim_writes_the_owner_once_and_a_dag_that_lost_the_race_is_refused():
    s3 = FakeS3()
    claim_s3(s3, REGISTRY, "team_a")
    key = f"models/digits/{OWNER_FILE}"
    assert json.loads(s3.objects[key])["dag_id"] == "team_a"
    first = s3.objects[key]
    claim_s3(s3, REGISTRY, "team_a")  # already its own: nothing written
    assert s3.objects[key] is first

    raced = FakeS3()
    raced.before_put = lambda s3: s3.objects.__setitem__(key, b'{"dag_id": "team_b"}')
    with pytest.raises(RegistryOwnerError, match="belongs to DAG 'team_b': DAG 'team_a' may not"):
        claim_s3(raced, REGISTRY, "team_a")
    assert json.loads(raced.objects[key])["dag_id"] == "team_b"


def test_a_store_without_conditional_writes_still_gets_the_record_and_reads_it_back():
    s3 = FakeS3(conditional=False)
    claim_s3(s3, REGISTRY, "team_a")
    assert json.loads(s3.objects[f"models/digits/{OWNER_FILE}"])["dag_id"] == "team_a"


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
    ("existing", "created_meanwhile", "owner"),
    [
        (None, None, "team_a"),  # a new model, created with its owner
        ({}, None, "team_a"),  # a model from before owners: adopted
        ({"team": "ml"}, None, "team_a"),
        (None, {}, "team_a"),  # created without a tag meanwhile: adopted
        (None, {OWNER_TAG: "team_b"}, "team_b"),  # created by another DAG's promotion meanwhile: refused
        ({OWNER_TAG: "team_b"}, None, "team_b"),
    ],
)
def test_an_mlflow_claim_creates_or_adopts_the_model_and_refuses_another_dag_s(existing, created_meanwhile, owner):
    client = FakeMlflow()
    if existing is not None:
        client.models["digits"] = existing
    if created_meanwhile is not None:
        client.before_create = lambda c: c.models.setdefault("digits", dict(created_meanwhile))
    registry = MLflowRegistry(client, "digits", "http://mlflow:5000")
    if owner == "team_a":
        claim_mlflow(registry, "team_a")
    else:
        with pytest.raises(RegistryOwnerError, match="the registry models:/digits belongs to DAG 'team_b'"):
            claim_mlflow(registry, "team_a")
    assert client.models["digits"][OWNER_TAG] == owner
