"""Whose a registry is: the DAGs whose winners it holds, by DAG id (never a name a DAG file chooses).

A DAG promotes into a registry when it is one of the registry's DAGs:

- the deployment's list, when ``[airflow_tune] registry_dags`` (``AIRFLOW__AIRFLOW_TUNE__REGISTRY_DAGS``, a JSON
  object ``{"<registry uri>": ["<dag id>", ...]}``) names the registry: then that list alone decides;
- else the registry's record: each DAG that promoted into it records the DAG ids its DAG file shares the registry
  with (``PromoteCheckpointOperator(registry_dags=[...])``, its own id always included), and the registry's DAGs are
  the ones **every** such DAG file lists. The first promotion adopts a registry with no record, so a DAG alone owns
  its registry; a second DAG shares it only once the DAGs already there list it too, so no other DAG file can write
  its way in.

The record is kept beside the registry:

- on S3, ``owner.json`` beside ``champion.json`` (``{"dags": {"<dag id>": [...its list...]}, ...}``), first written
  with S3's conditional put (``If-None-Match: *``), so of two DAGs racing for a new registry only one writes it;
- in MLflow, the registered model's tag ``airflow_tune.registry_dags`` (the same JSON), given when the promotion
  creates the model or set at its first promotion.

A record from before (``{"dag_id": "<name>"}``, the tag ``airflow_tune.owner_dag_id``) named a free-text owner that
any DAG file could write: it counts as that name's own list, so only a DAG of that id passes; remove it (as the
bucket's or registry's owner) to let the next promotion adopt the registry. The registry's DAGs are checked before the
champion is read (a refused promotion learns nothing of the registry but its DAGs) and again at load: a version whose
experiment ran for another DAG is refused (:func:`dags_of`). The record is storage, so whoever may write the
bucket or the registry may change it: give them the bucket's or the registry's own permissions.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow_tune.exceptions import MLflowError, PromotionError
from airflow_tune.registries.s3 import RegistryError, split_s3_uri

OWNER_FILE = "owner.json"
DAGS_TAG = "airflow_tune.registry_dags"
#: The tag of a record from before registries were owned by DAG ids (a free-text owner name).
OWNER_TAG = "airflow_tune.owner_dag_id"
CONFIG_SECTION = "airflow_tune"
DEPLOYMENT_OPTION = "registry_dags"
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")
#: ``{dag id: the DAG ids its DAG file shares the registry with}``.
Record = dict[str, list[str]]


@dataclass(frozen=True)
class Claim:
    """A promote task's claim on a registry: its DAG, the DAG ids its DAG file shares the registry with (its own
    included), and the deployment's list for the registry, when the deployment names one."""

    dag_id: str
    shares_with: tuple[str, ...]
    deployment: tuple[str, ...] | None = None

    @classmethod
    def of(cls, dag_id: str, registry_dags: Iterable[str], deployment: Iterable[str] | None = None) -> Claim:
        return cls(
            dag_id,
            tuple(sorted({dag_id, *registry_dags})),
            tuple(sorted(set(deployment))) if deployment is not None else None,
        )


class RegistryOwnerError(PromotionError):
    """A promotion into (or a load from) a registry by a DAG that is not one of its DAGs."""

    def __init__(self, registry: str, dags: Collection[str], dag_id: str, by_deployment: bool = False) -> None:
        self.registry, self.dags, self.dag_id, self.by_deployment = registry, sorted(dags), dag_id, by_deployment
        names = ", ".join(repr(d) for d in self.dags) or "none"
        if by_deployment:
            fix = (
                f"the deployment's [{CONFIG_SECTION}] {DEPLOYMENT_OPTION} lists this registry's DAGs: add {dag_id!r} "
                "there, or give this DAG a registry_uri of its own"
            )
        else:
            fix = (
                f"a DAG shares a registry only when every DAG that promotes into it lists it in registry_dags; add "
                f"{dag_id!r} to registry_dags in those DAG files (and list them in this one), or give this DAG a "
                "registry_uri of its own"
            )
        super().__init__(f"the registry {registry} belongs to DAG(s) {names}: DAG {dag_id!r} may not use it. {fix}")

    def __reduce__(self) -> tuple[type[RegistryOwnerError], tuple[str, list[str], str, bool]]:
        return (type(self), (self.registry, self.dags, self.dag_id, self.by_deployment))


def deployment_dags(registry_uri: str) -> tuple[str, ...] | None:
    """The deployment's list of the DAGs that may use ``registry_uri`` (``[airflow_tune] registry_dags``), or None
    when it names none for it."""
    from airflow.configuration import conf

    text = conf.get(CONFIG_SECTION, DEPLOYMENT_OPTION, fallback="") or ""
    if not text.strip():
        return None
    where = f"[{CONFIG_SECTION}] {DEPLOYMENT_OPTION}"
    try:
        mapping = json.loads(text)
    except ValueError:
        mapping = None
    if not isinstance(mapping, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(d, str) and d for d in v)
        for k, v in mapping.items()
    ):
        raise ValueError(
            f"{where} must be a JSON object of registry URIs to lists of DAG ids, e.g. "
            '{"models:/digits": ["digits_retrain_weekly", "digits_tune_from_ui"]}'
        )
    dags = mapping.get(registry_uri.rstrip("/"))
    return tuple(sorted(set(dags))) if dags is not None else None


def allowed_dags(record: Mapping[str, Collection[str]] | None) -> set[str]:
    """The DAGs a record admits: the ones every recorded DAG's file lists."""
    lists = [set(v) for v in (record or {}).values()]
    return set.intersection(*lists) if lists else set()


def decide(registry: str, record: Mapping[str, Collection[str]] | None, claim: Claim) -> bool:
    """Whether ``registry``'s record already says what ``claim`` does (True), or must be written (False: no record
    yet, or this DAG's list changed).

    :raises RegistryOwnerError: the DAG is not one of the registry's DAGs.
    """
    if claim.deployment is not None:
        if claim.dag_id not in claim.deployment:
            raise RegistryOwnerError(registry, claim.deployment, claim.dag_id, by_deployment=True)
    elif record is not None and claim.dag_id not in allowed_dags(record):
        raise RegistryOwnerError(registry, allowed_dags(record), claim.dag_id)
    return record is not None and sorted(record.get(claim.dag_id) or ()) == list(claim.shares_with)


def dags_of(registry: str, record: Mapping[str, Collection[str]] | None) -> set[str]:
    """The DAGs whose versions a load from ``registry`` believes: the deployment's list for it, else the ones its
    record admits (none without a record: every promotion writes one before its first version)."""
    deployment = deployment_dags(registry)
    return set(deployment) if deployment is not None else allowed_dags(record)


def record_of(registry: str, body: bytes) -> Record:
    """The record an ``owner.json`` (or the MLflow tag) holds; PromotionError when it is not one we wrote."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and set(parsed) >= {"dag_id"} and "dags" not in parsed:
        owner = parsed.get("dag_id")
        if isinstance(owner, str) and owner:
            return {owner: [owner]}  # a record from before: a free-text owner name, only its own
    dags = parsed.get("dags") if isinstance(parsed, dict) else None
    if (
        not isinstance(dags, dict)
        or not dags
        or not all(
            isinstance(k, str) and k and isinstance(v, list) and all(isinstance(d, str) and d for d in v)
            for k, v in dags.items()
        )
    ):
        raise PromotionError(
            f"the registry {registry} has an owner record ({OWNER_FILE}) that names no DAG: refusing to use it; "
            "have whoever owns the bucket fix or remove it"
        )
    return {k: sorted(set(v)) for k, v in dags.items()}


def record_body(record: Mapping[str, Collection[str]]) -> bytes:
    dags = {k: sorted(set(v)) for k, v in sorted(record.items())}
    return json.dumps({"dags": dags, "updated_at": datetime.now(timezone.utc).isoformat()}, indent=1).encode()


def _dags_tag(record: Mapping[str, Collection[str]]) -> str:
    """The MLflow tag's value of ``record`` (the same JSON as ``owner.json``'s ``dags``, compact)."""
    return json.dumps({"dags": {k: sorted(set(v)) for k, v in sorted(record.items())}}, separators=(",", ":"))


def _with(record: Mapping[str, Collection[str]] | None, claim: Claim) -> Record:
    out = {k: sorted(v) for k, v in (record or {}).items()}
    out[claim.dag_id] = list(claim.shares_with)
    return out


# -- S3 ------------------------------------------------------------------------------------------------------------
def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None


def read_s3_record(s3: Any, registry_uri: str) -> Record | None:
    """The record the registry's ``owner.json`` holds, or None when it has none."""
    bucket, prefix = split_s3_uri(registry_uri)
    key = f"{prefix}/{OWNER_FILE}"
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:
        if _error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise RegistryError(f"cannot read the owner record s3://{bucket}/{key}: {exc}") from exc
    return record_of(registry_uri, body)


def check_s3(s3: Any, registry_uri: str, claim: Claim) -> bool:
    """:func:`decide` for an S3 registry."""
    return decide(registry_uri, read_s3_record(s3, registry_uri), claim)


def claim_s3(s3: Any, registry_uri: str, claim: Claim) -> None:
    """Record ``claim`` in the S3 registry's ``owner.json`` (adopting a registry without one); refuse when the DAG is
    not one of its DAGs (or another DAG won the race for a new registry and does not list it)."""
    bucket, prefix = split_s3_uri(registry_uri)
    put = {"Bucket": bucket, "Key": f"{prefix}/{OWNER_FILE}", "ContentType": "application/json"}
    for _ in range(2):  # a lost race for a new registry: the winner's record, read back, decides
        record = read_s3_record(s3, registry_uri)
        if decide(registry_uri, record, claim):
            return
        body = record_body(_with(record, claim))
        if record is not None:
            s3.put_object(**put, Body=body)
            continue
        try:
            s3.put_object(**put, Body=body, IfNoneMatch="*")
        except Exception as exc:
            code = _error_code(exc)
            if code == "NotImplemented":  # a store without conditional writes: the read-back still decides
                s3.put_object(**put, Body=body)
            elif code not in _LOST_RACE:
                raise RegistryError(f"cannot write the owner record s3://{bucket}/{put['Key']}: {exc}") from exc
    record = read_s3_record(s3, registry_uri)
    if record is None or not decide(registry_uri, record, claim):
        raise RegistryError(f"the owner record of {registry_uri} is not the one written right before")


# -- MLflow --------------------------------------------------------------------------------------------------------
def read_mlflow_record(registry: Any) -> tuple[bool, Record | None]:
    """Whether the registered model exists, and the record its tags hold (None when it has none)."""
    model = registry.call(
        "read the registered model", registry.client.get_registered_model, registry.name, missing_ok=True
    )
    if model is None:
        return False, None
    tags = getattr(model, "tags", None) or {}
    where = f"models:/{registry.name}"
    if isinstance(tags.get(DAGS_TAG), str) and tags[DAGS_TAG]:
        return True, record_of(where, tags[DAGS_TAG].encode())
    legacy = tags.get(OWNER_TAG)
    return True, ({legacy: [legacy]} if isinstance(legacy, str) and legacy else None)


def check_mlflow(registry: Any, claim: Claim) -> bool:
    """:func:`decide` for an MLflow registered model (a :class:`~airflow_tune.registries.mlflow.MLflowRegistry`)."""
    return decide(f"models:/{registry.name}", read_mlflow_record(registry)[1], claim)


def claim_mlflow(registry: Any, claim: Claim) -> None:
    """Create the registered model with ``claim`` as its record, or record it on an existing one; refuse when the DAG
    is not one of its DAGs. MLflow has no conditional write: two DAGs adopting the same new model within the same
    moment may both see their own record."""
    where = f"models:/{registry.name}"
    client = registry.client
    exists, record = read_mlflow_record(registry)
    if decide(where, record, claim):
        return
    if not exists:
        try:
            registry.call(
                "create the registered model",
                client.create_registered_model,
                registry.name,
                tags={DAGS_TAG: _dags_tag(_with(None, claim))},
            )
        except MLflowError as exc:
            if getattr(exc.__cause__, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
        # Created here or by another promotion meanwhile: its record, read back, decides.
        exists, record = read_mlflow_record(registry)
        if decide(where, record, claim):
            return
    tag = _dags_tag(_with(record, claim))
    registry.call("record the registry's DAGs", client.set_registered_model_tag, registry.name, DAGS_TAG, tag)
    if not decide(where, read_mlflow_record(registry)[1], claim):
        raise MLflowError(f"the DAGs tag of {where} is not the one set right before")
