"""The model registry's public face for deploy DAGs: its Asset, and its champion proven by the experiment's Ray job.

The registry's layout and its reads and writes are :mod:`airflow_tune.registries.s3`'s. boto3 is imported inside the
functions (DAG files import this module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries.s3 import RegistryError, prove_checkpoint, read_champion, s3_client

if TYPE_CHECKING:
    from airflow_tune.registries.record import Promotion

__all__ = ["champion_checkpoint", "champion_model", "proven_champion", "registry_asset"]


def registry_asset(registry_uri: str) -> Any:
    """The Asset a promotion updates; schedule deploy DAGs on it."""
    from airflow.sdk import Asset

    return Asset(uri=registry_uri.rstrip("/"), name=registry_uri.rstrip("/"))


def champion_checkpoint(
    registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None, promotion: Any = None
) -> tuple[str, str]:
    """The champion's checkpoint in the S3 registry (with ``promotion``: the version that promotion registered) and
    the content digest its files must have, proven: the registry is storage, so it is believed only as far as the Ray
    job of the experiment it names vouches for the checkpoint and its digest (see
    :func:`airflow_tune.trust.proofs.proven_result`), and Airflow's record of the promotion names the version. Hand
    both (and ``promotion``) to :func:`airflow_tune.checkpoints.download_checkpoint`, which verifies the bytes.

    :param registry_uri: ``s3://bucket/models/<name>``.
    :param ray_conn_id: the Ray cluster that ran the champion's experiment.
    :param s3: an S3 client (boto3's own credential chain by default).
    :param promotion: Airflow's record of the promotion: the promote task's XCom or the registry's Asset event (see
        :func:`airflow_tune.checkpoints.download_model`).
    """
    pointer, _, _ = proven_pointer(registry_uri, ray_conn_id=ray_conn_id, s3=s3, promotion=promotion)
    return str(pointer["uri"]), str(pointer["checkpoint_digest"])


def proven_champion(
    registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None, promotion: Any = None
) -> tuple[dict[str, Any], str]:
    """The champion pointer of the S3 registry (or, with ``promotion``, the pointer of the version it registered),
    its checkpoint proven by its experiment's Ray job (see :func:`champion_checkpoint`), and a description of it."""
    pointer, where, _ = proven_pointer(registry_uri, ray_conn_id=ray_conn_id, s3=s3, promotion=promotion)
    return pointer, where


def version_pointer(registry_uri: str, version: str, s3: Any) -> dict[str, Any]:
    """A version's pointer (as ``champion.json`` holds one) from its ``model.json``."""
    import json

    from airflow_tune.registries.s3 import split_s3_uri

    bucket, prefix = split_s3_uri(registry_uri)
    if not version or "/" in version or version in (".", ".."):
        raise PromotionError(f"version {version[:100]!r}: not a version of {registry_uri}")
    key = f"{prefix}/versions/{version}/model.json"
    try:
        card = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except Exception as exc:
        raise RegistryError(f"cannot read version {version} of {registry_uri} (s3://{bucket}/{key}): {exc}") from exc
    card = card if isinstance(card, dict) else {}
    provenance, model = card.get("provenance") or {}, card.get("mlflow_model") or {}
    return {
        "version": card.get("version"),
        "uri": f"s3://{bucket}/{prefix}/versions/{version}/checkpoint",
        "experiment_uri": provenance.get("experiment_uri"),
        "source_checkpoint_uri": provenance.get("source_checkpoint_uri"),
        "checkpoint_digest": card.get("checkpoint_digest"),
        "mlflow_model_uri": model.get("uri"),
        "mlflow_model_digest": model.get("digest"),
        "promoted_by": card.get("promoted_by"),
    }


def proven_pointer(
    registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None, promotion: Any = None
) -> tuple[dict[str, Any], str, Promotion | None]:
    """The pointer of the champion (or of the version ``promotion`` registered), proven by its experiment's Ray job,
    a description of it, and Airflow's record of its promotion: ``promotion`` checked, or inside an Airflow task the
    XCom of the promote task instance the version names (None outside Airflow without one: said in the log)."""
    from airflow_tune.registries import record
    from airflow_tune.registries.owner import dags_of, read_s3_record

    registry_uri = registry_uri.rstrip("/")
    s3 = s3 if s3 is not None else s3_client()
    dags = dags_of(registry_uri, read_s3_record(s3, registry_uri))
    given = record.of(promotion, registry_uri, dags) if promotion is not None else None
    if given is not None:
        pointer: dict[str, Any] | None = version_pointer(registry_uri, given.version, s3)
        where = f"version {given.version[:100]} of {registry_uri}"
    else:
        pointer = read_champion(registry_uri, s3)
        if pointer is None:
            raise RegistryError(f"no champion in {registry_uri}: nothing to load")
        where = f"the champion of {registry_uri} (version {str(pointer.get('version'))[:100]})"
    assert pointer is not None
    experiment_uri, source = pointer.get("experiment_uri"), pointer.get("source_checkpoint_uri")
    digest, copy = pointer.get("checkpoint_digest"), pointer.get("uri")
    if not all(isinstance(v, str) and v for v in (experiment_uri, source, digest, copy)):
        raise PromotionError(f"{where} was not promoted by this version of airflow-tune: refusing to load it")
    if not str(copy).startswith(registry_uri + "/"):
        raise PromotionError(f"{where} names a checkpoint outside its registry: refusing to load it")
    prove_checkpoint(where, str(experiment_uri), str(source), str(digest), ray_conn_id=ray_conn_id, dags=dags)
    found = given
    if found is None:
        found = record.from_airflow(registry_uri, pointer.get("promoted_by"), where, dags)
        if found is None:
            record.fallback_warning(where)
    folder = str(copy).rsplit("/", 1)[0]
    if found is not None and (found.folder != folder or found.version != str(pointer.get("version"))):
        raise PromotionError(
            f"{where}: Airflow's record of its promotion ({found.what}) names version {found.version} in "
            f"{found.folder}, not {folder}: refusing to load it"
        )
    return pointer, where, found


def champion_model(
    registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None, promotion: Any = None
) -> tuple[str, str, str, str]:
    """The champion's MLflow Model in the S3 registry (the version's folder, promoted with ``model_loader``; with
    ``promotion``, the version it registered), its checkpoint proven as :func:`champion_checkpoint` proves it:
    ``(model folder, digest of all its files but model.json, checkpoint digest, description)``.
    :func:`airflow_tune.checkpoints.download_model` verifies them (and the files against Airflow's record).

    :param registry_uri: ``s3://bucket/models/<name>``.
    :param ray_conn_id: the Ray cluster that ran the champion's experiment.
    :param s3: an S3 client (boto3's own credential chain by default).
    :param promotion: Airflow's record of the promotion (see :func:`champion_checkpoint`).
    """
    pointer, where, _ = proven_pointer(registry_uri, ray_conn_id=ray_conn_id, s3=s3, promotion=promotion)
    return model_of(pointer, where)


def model_of(pointer: dict[str, Any], where: str) -> tuple[str, str, str, str]:
    """:func:`champion_model`'s answer from a proven pointer."""
    copy, model_uri, model_digest = (
        str(pointer["uri"]),
        pointer.get("mlflow_model_uri"),
        pointer.get("mlflow_model_digest"),
    )
    if not model_uri or not isinstance(model_digest, str):
        raise PromotionError(
            f"{where} is a bare checkpoint, not an MLflow Model: promote with model_loader= to load it with MLflow"
        )
    if model_uri not in (copy, copy.rsplit("/", 1)[0]):
        raise PromotionError(f"{where} names an MLflow Model outside its version's folder: refusing to load it")
    return str(model_uri), model_digest, str(pointer["checkpoint_digest"]), where
