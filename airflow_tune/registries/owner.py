"""Whose a registry is: the DAG whose winners it holds. A registry records its owner DAG when that DAG's promotion
first moves it, and refuses every other DAG's promotion, naming the registry and its owner only.

- On S3, ``owner.json`` beside ``champion.json`` (``{"dag_id": ..., "claimed_at": ...}``), written once with S3's
  conditional put (``If-None-Match: *``), so of two DAGs racing for a new registry only one writes it, then read back.
- In MLflow, the registered model's tag ``airflow_tune.owner_dag_id``: given when the promotion creates the model,
  or set on a model without it at the first promotion, then read back. MLflow has no conditional write: two DAGs
  adopting the same untagged model within the same moment may both see their own tag.

The owner is checked before the champion is read (a refused promotion learns nothing of the registry but its
owner's DAG id), and claimed before the first write of a promotion. A registry from before owners were recorded (no
record) is adopted by the first DAG that promotes into it. The record guards against a DAG run (data) reaching
another DAG's registry; it is storage, so whoever may write the bucket or the registry may change it: give them
the bucket's or the registry's own permissions.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from airflow_tune.exceptions import MLflowError, PromotionError
from airflow_tune.registries.s3 import RegistryError, split_s3_uri

OWNER_FILE = "owner.json"
OWNER_TAG = "airflow_tune.owner_dag_id"
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


class RegistryOwnerError(PromotionError):
    """A promotion into a registry another DAG owns."""

    def __init__(self, registry: str, owner: str, dag_id: str) -> None:
        self.registry, self.owner, self.dag_id = registry, owner, dag_id
        super().__init__(
            f"the registry {registry} belongs to DAG {owner!r}: DAG {dag_id!r} may not promote into it. A registry "
            f"holds the winners of the DAG that first promoted into it; give this DAG a registry_uri of its own, or "
            f"promote from DAG {owner!r} (DAGs that share a registry write the same registry_owner, e.g. "
            f"registry_owner={owner!r})"
        )

    def __reduce__(self) -> tuple[type[RegistryOwnerError], tuple[str, str, str]]:
        return (type(self), (self.registry, self.owner, self.dag_id))


def decide(registry: str, recorded: str | None, dag_id: str) -> bool:
    """Whether ``registry`` is already ``dag_id``'s (True) or has no owner yet (False: the promotion adopts it).

    :raises RegistryOwnerError: another DAG owns it.
    """
    if recorded is None:
        return False
    if recorded != dag_id:
        raise RegistryOwnerError(registry, recorded, dag_id)
    return True


def owner_of_record(registry: str, body: bytes) -> str:
    """The owner DAG id an ``owner.json`` names; PromotionError when it is not one we wrote."""
    try:
        record = json.loads(body)
    except ValueError:
        record = None
    owner = record.get("dag_id") if isinstance(record, dict) else None
    if not isinstance(owner, str) or not owner:
        raise PromotionError(
            f"the registry {registry} has an owner record ({OWNER_FILE}) that names no DAG: refusing to promote into "
            "it; have whoever owns the bucket fix or remove it"
        )
    return owner


def owner_record(dag_id: str) -> bytes:
    return json.dumps({"dag_id": dag_id, "claimed_at": datetime.now(timezone.utc).isoformat()}, indent=1).encode()


# -- S3 ------------------------------------------------------------------------------------------------------------
def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None


def read_s3_owner(s3: Any, registry_uri: str) -> str | None:
    """The owner DAG id the registry's ``owner.json`` records, or None when it has none."""
    bucket, prefix = split_s3_uri(registry_uri)
    key = f"{prefix}/{OWNER_FILE}"
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:
        if _error_code(exc) in ("NoSuchKey", "404"):
            return None
        raise RegistryError(f"cannot read the owner record s3://{bucket}/{key}: {exc}") from exc
    return owner_of_record(registry_uri, body)


def check_s3(s3: Any, registry_uri: str, dag_id: str) -> bool:
    """:func:`decide` for an S3 registry: True when ``dag_id`` owns it, False when nobody does yet."""
    return decide(registry_uri, read_s3_owner(s3, registry_uri), dag_id)


def claim_s3(s3: Any, registry_uri: str, dag_id: str) -> None:
    """Make ``dag_id`` the S3 registry's owner unless it is already; refuse when another DAG is (or won the race)."""
    if check_s3(s3, registry_uri, dag_id):
        return
    bucket, prefix = split_s3_uri(registry_uri)
    put = {"Bucket": bucket, "Key": f"{prefix}/{OWNER_FILE}", "ContentType": "application/json"}
    try:
        s3.put_object(**put, Body=owner_record(dag_id), IfNoneMatch="*")
    except Exception as exc:
        code = _error_code(exc)
        if code == "NotImplemented":  # a store without conditional writes: the read-back below still decides
            s3.put_object(**put, Body=owner_record(dag_id))
        elif code not in _LOST_RACE:
            raise RegistryError(f"cannot write the owner record s3://{bucket}/{put['Key']}: {exc}") from exc
    if not check_s3(s3, registry_uri, dag_id):
        raise RegistryError(f"the owner record of {registry_uri} is missing right after it was written")


# -- MLflow --------------------------------------------------------------------------------------------------------
def read_mlflow_owner(registry: Any) -> tuple[bool, str | None]:
    """Whether the registered model exists, and the owner DAG id its tag records (None when it has none)."""
    model = registry.call(
        "read the registered model", registry.client.get_registered_model, registry.name, missing_ok=True
    )
    if model is None:
        return False, None
    owner = (getattr(model, "tags", None) or {}).get(OWNER_TAG)
    return True, owner if isinstance(owner, str) and owner else None


def check_mlflow(registry: Any, dag_id: str) -> bool:
    """:func:`decide` for an MLflow registered model (a :class:`~airflow_tune.registries.mlflow.MLflowRegistry`)."""
    return decide(f"models:/{registry.name}", read_mlflow_owner(registry)[1], dag_id)


def claim_mlflow(registry: Any, dag_id: str) -> None:
    """Create the registered model with ``dag_id`` as its owner, or record it on a model without one; refuse when
    another DAG owns it."""
    where = f"models:/{registry.name}"
    exists, owner = read_mlflow_owner(registry)
    if decide(where, owner, dag_id):
        return
    client = registry.client
    if not exists:
        try:
            registry.call(
                "create the registered model", client.create_registered_model, registry.name, tags={OWNER_TAG: dag_id}
            )
        except MLflowError as exc:
            if getattr(exc.__cause__, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            # Created by another promotion meanwhile: its tag, read below, decides.
            exists, owner = read_mlflow_owner(registry)
            if decide(where, owner, dag_id):
                return
    if exists:
        registry.call("record the owner tag", client.set_registered_model_tag, registry.name, OWNER_TAG, dag_id)
    if not check_mlflow(registry, dag_id):
        raise MLflowError(f"the owner tag of {where} is missing right after it was set")
