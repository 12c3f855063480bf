"""The model registry's public face for deploy DAGs: its Asset, and its champion proven by the experiment's Ray job.

The registry's layout and its reads and writes are :mod:`airflow_tune.registries.s3`'s. boto3 is imported inside the
functions (DAG files import this module).
"""

from __future__ import annotations

from typing import Any

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries.s3 import RegistryError, prove_checkpoint, read_champion, s3_client

__all__ = ["champion_checkpoint", "champion_model", "proven_champion", "registry_asset"]


def registry_asset(registry_uri: str) -> Any:
    """The Asset a promotion updates; schedule deploy DAGs on it."""
    from airflow.sdk import Asset

    return Asset(uri=registry_uri.rstrip("/"), name=registry_uri.rstrip("/"))


def champion_checkpoint(registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None) -> tuple[str, str]:
    """The champion's checkpoint in the S3 registry and the content digest its files must have, proven: the pointer
    is storage, so it is believed only as far as the Ray job of the experiment it names vouches for the checkpoint
    and its digest (see :func:`airflow_tune.trust.proofs.proven_result`). Hand both to
    :func:`airflow_tune.checkpoints.download_checkpoint` (``expected_digest``), which verifies the bytes.

    :param registry_uri: ``s3://bucket/models/<name>``.
    :param ray_conn_id: the Ray cluster that ran the champion's experiment.
    :param s3: an S3 client (boto3's own credential chain by default).
    """

    champion, where = proven_champion(registry_uri, ray_conn_id=ray_conn_id, s3=s3)
    return str(champion["uri"]), str(champion["checkpoint_digest"])


def proven_champion(
    registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None
) -> tuple[dict[str, Any], str]:
    """The champion pointer of the S3 registry, its checkpoint proven by its experiment's Ray job (see
    :func:`champion_checkpoint`), and a description of it for messages."""
    s3 = s3 if s3 is not None else s3_client()
    champion = read_champion(registry_uri, s3)
    if champion is None:
        raise RegistryError(f"no champion in {registry_uri}: nothing to load")
    where = f"the champion of {registry_uri} (version {str(champion.get('version'))[:100]})"
    experiment_uri, source = champion.get("experiment_uri"), champion.get("source_checkpoint_uri")
    digest, copy = champion.get("checkpoint_digest"), champion.get("uri")
    if not all(isinstance(v, str) and v for v in (experiment_uri, source, digest, copy)):
        raise PromotionError(f"{where} was not promoted by this version of airflow-tune: refusing to load it")
    if not str(copy).startswith(registry_uri.rstrip("/") + "/"):
        raise PromotionError(f"{where} names a checkpoint outside its registry: refusing to load it")
    from airflow_tune.registries.owner import dags_of, read_s3_record

    dags = dags_of(registry_uri, read_s3_record(s3, registry_uri))
    prove_checkpoint(where, str(experiment_uri), str(source), str(digest), ray_conn_id=ray_conn_id, dags=dags)
    return champion, where


def champion_model(registry_uri: str, *, ray_conn_id: str = "ray_default", s3: Any = None) -> tuple[str, str, str, str]:
    """The champion's MLflow Model in the S3 registry (the version's folder, promoted with ``model_loader``), its
    checkpoint proven as :func:`champion_checkpoint` proves it: ``(model folder, digest of all its files but
    model.json, checkpoint digest, description)``. :func:`airflow_tune.checkpoints.download_model` verifies them.

    :param registry_uri: ``s3://bucket/models/<name>``.
    :param ray_conn_id: the Ray cluster that ran the champion's experiment.
    :param s3: an S3 client (boto3's own credential chain by default).
    """
    champion, where = proven_champion(registry_uri, ray_conn_id=ray_conn_id, s3=s3)
    copy, model_uri, model_digest = (
        str(champion["uri"]),
        champion.get("mlflow_model_uri"),
        champion.get("mlflow_model_digest"),
    )
    if not model_uri or not isinstance(model_digest, str):
        raise PromotionError(
            f"{where} is a bare checkpoint, not an MLflow Model: promote with model_loader= to load it with MLflow"
        )
    if model_uri not in (copy, copy.rsplit("/", 1)[0]):
        raise PromotionError(f"{where} names an MLflow Model outside its version's folder: refusing to load it")
    return str(model_uri), model_digest, str(champion["checkpoint_digest"]), where
