"""The model registry on S3: its layout, its Asset, and the one way to reach it (boto3, or an Amazon connection).

Layout under ``registry_uri`` (``s3://bucket/prefix``)::

    versions/<version>/checkpoint/...   the checkpoint's files, streamed through the promote task and hashed
    versions/<version>/model.json       config, metrics and provenance
    champion.json                       the pointer to the current champion, switched last

:class:`~airflow_tune.operators.promote.PromoteCheckpointOperator` writes it; warm starts and deploy tasks read the
champion with :func:`read_champion`. boto3 is imported inside the functions (DAG files import this module).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY, CHECKPOINT_FILES_KEY
from airflow_tune.exceptions import AirflowTuneException, PromotionError

CHAMPION_FILE = "champion.json"


class RegistryError(AirflowTuneException):
    """The registry could not be read or written."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI; give s3://bucket/prefix")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} has no bucket; give s3://bucket/prefix")
    return bucket, key.strip("/")


def s3_client(aws_conn_id: str | None = None) -> Any:
    """An S3 client: the Amazon connection's when ``aws_conn_id`` is given, else boto3's own credential chain
    (environment, profile, instance role)."""
    if aws_conn_id:
        try:
            from airflow.providers.amazon.aws.hooks.s3 import S3Hook
        except ImportError:
            raise ValueError(
                "aws_conn_id needs apache-airflow-providers-amazon; install it or leave aws_conn_id unset"
            ) from None
        return S3Hook(aws_conn_id=aws_conn_id).get_conn()
    import boto3

    return boto3.client("s3")


def read_champion(registry_uri: str, s3: Any = None, *, aws_conn_id: str | None = None) -> dict[str, Any] | None:
    """The registry's current champion pointer, or None when it has none yet.

    :param registry_uri: ``s3://bucket/models/<name>``.
    :param s3: an S3 client; by default :func:`s3_client` of ``aws_conn_id``.
    :param aws_conn_id: an Amazon connection to read with.
    """
    bucket, prefix = split_s3_uri(registry_uri)
    s3 = s3 if s3 is not None else s3_client(aws_conn_id)
    key = f"{prefix}/{CHAMPION_FILE}" if prefix else CHAMPION_FILE
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code")
        if code in ("NoSuchKey", "404"):
            return None
        raise RegistryError(f"cannot read the champion pointer s3://{bucket}/{key}: {exc}") from exc
    return dict(json.loads(body))


def list_checkpoint(s3: Any, source_uri: str) -> list[dict[str, Any]]:
    """The objects of the checkpoint under ``source_uri`` (S3 listing entries plus ``rel``, the relative key)."""
    src_bucket, src_prefix = split_s3_uri(source_uri)
    listed = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=src_bucket, Prefix=f"{src_prefix}/" if src_prefix else ""):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(src_prefix) + 1 :] if src_prefix else obj["Key"]
            if not rel or rel.endswith("/"):
                continue  # pyarrow's 0-byte folder markers
            listed.append({**obj, "rel": rel})
    return listed


def check_listing(result: Mapping[str, Any], objects: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a checkpoint whose files are not the ones the trial wrote (added, removed or renamed since), before
    the gate; their bytes are checked as the promotion copies them (:mod:`airflow_tune.registries.transfer`)."""
    from airflow_tune.common.provenance import CHECKPOINT_FILES_KEY, differences

    files = result.get(CHECKPOINT_FILES_KEY)
    listed = {str(o["rel"]): "" for o in objects}
    if not isinstance(files, dict) or not files:
        raise PromotionError(
            f"the result names no content digests for the checkpoint {result.get('best_checkpoint_uri')}: it was not "
            "written by this version of airflow-tune's engine; run the experiment again"
        )
    if set(listed) != set(files):
        found = {k: files.get(k, "") for k in listed}
        raise PromotionError(
            f"the checkpoint {result.get('best_checkpoint_uri')} holds other files than its trial wrote "
            f"({differences(files, found)}): not promoting it"
        )


def prove_checkpoint(
    where: str,
    experiment_uri: str,
    source: Any,
    digest: str,
    *,
    ray_conn_id: str,
    dag_id: str | None = None,
    dags: Collection[str] | None = None,
) -> None:
    """Refuse (naming ``where``) unless the checkpoint ``source`` with the content ``digest`` is the best checkpoint
    of the experiment at ``experiment_uri`` as its own Ray job sealed it (:func:`airflow_tune.utils.reconcile.
    proven_result`; ``dag_id``: that job ran for this DAG; ``dags``: for one of these, the registry's DAGs). What a
    registry records is written by whoever may write the registry: this is what makes it believed."""
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, inside_experiment, manifest_uri
    from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY
    from airflow_tune.exceptions import ExperimentStorageError
    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.trust import proofs

    if not inside_experiment(source, experiment_uri):
        raise PromotionError(f"{where}: its checkpoint lies outside the experiment it names: refusing to load it")
    owner = {"dag_id": dag_id} if dag_id is not None else None
    try:
        data = storage.read_bytes(manifest_uri(experiment_uri, RESULT_FILE))
        # No task's record to read here (a deploy helper may run anywhere): the promotion's own record in Airflow
        # anchors what a deploy loads.
        result = proofs.proven_result(
            RayHook(ray_conn_id), experiment_uri, data, owner=owner, submitted=None, same_dag_only=True, dags=dags
        )
    except (ValueError, OSError, ExperimentStorageError) as exc:
        raise PromotionError(f"{where} is not proven by the experiment it names: {exc}; refusing to load it") from exc
    if result.get("best_checkpoint_uri") != source or result.get(CHECKPOINT_DIGEST_KEY) != digest:
        raise PromotionError(
            f"{where} names a checkpoint or digest that its experiment's sealed result does not: refusing to load it"
        )


# -- a version's files, written by the promote task ------------------------------------------------------------


def version_name(result: dict[str, Any], objects: Sequence[dict[str, Any]] = ()) -> str:
    """Deterministic per checkpoint, so a retried promotion rewrites the same version, and distinct per experiment,
    so another experiment's checkpoint of the same trial id and stamp is never taken for the champion (the
    "already the champion" shortcut of a retry skips the gate).

    ``<stamp>-<trial id>-<experiment>``: the stamp is the result's ``finished_at`` when it has one, else the newest
    ``LastModified`` of the checkpoint's objects (the XCom result has no time of its own); the experiment is the first
    12 hex digits of the sha256 of its URI (``experiment_uri``, else its name).
    """
    import hashlib

    stamp: datetime | None = None
    if result.get("finished_at"):
        stamp = datetime.fromtimestamp(float(result["finished_at"]), tz=timezone.utc)
    else:
        times = [o["LastModified"] for o in objects if isinstance(o.get("LastModified"), datetime)]
        if times:
            stamp = max(times).astimezone(timezone.utc)
    if stamp is None:
        raise PromotionError("cannot name the version: the result has no finished_at and no listed objects")
    experiment = str(result.get("experiment_uri") or result.get("experiment") or "")
    if not experiment:
        raise PromotionError("cannot name the version: the result names no experiment")
    tag = hashlib.sha256(experiment.encode()).hexdigest()[:12]
    return f"{stamp:%Y%m%dT%H%M%SZ}-{result.get('best_trial_id') or 'trial'}-{tag}"


def model_card(context: Any, result: dict[str, Any], version: str, copied: list[dict[str, Any]]) -> dict[str, Any]:
    """A version's ``model.json``: what was promoted, from which run and experiment, and its files' digests."""
    ti = context["ti"]
    return {
        "version": version,
        "metric": result.get("metric"),
        "mode": result.get("mode"),
        "value": (result.get("best_metrics") or {}).get(result.get("metric")),
        "config": result.get("best_config"),
        "metrics": result.get("best_metrics"),
        "files": copied,
        "checkpoint_files": result.get(CHECKPOINT_FILES_KEY),
        "checkpoint_digest": result.get(CHECKPOINT_DIGEST_KEY),
        "promoted_at": datetime.now(timezone.utc).isoformat(),
        "provenance": {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": context["run_id"],
            "experiment": result.get("experiment"),
            "experiment_uri": result.get("experiment_uri"),
            "trial_id": result.get("best_trial_id"),
            "source_checkpoint_uri": result.get("best_checkpoint_uri"),
            "ray_job_id": result.get("job_id"),
        },
    }
