"""Open a checkpoint in a downstream task: the best checkpoint from the URI in the XCom result, or a model version
in MLflow's Model Registry (``models:/<name>@champion``, ``models:/<name>/<version>``).

Storage and the registry are not trusted, and the caller unpickles what it gets: a registry version is believed only
when the Ray job of the experiment it names vouches for its checkpoint and content digest (see
:func:`airflow_tune.registries.mlflow.verified_source`), and the files are downloaded first and then verified, byte for
byte, against that digest (or the ``expected_digest`` given, e.g. the XCom result's ``best_checkpoint_digest``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from airflow_tune.common import storage
from airflow_tune.common.contract import is_mlflow_uri

if TYPE_CHECKING:
    from ray.tune import Checkpoint

    from airflow_tune.registries.record import Promotion


def download_checkpoint(
    uri: str,
    local_dir: str | None = None,
    *,
    expected_digest: str | None = None,
    promotion: Any = None,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> str:
    """Copy the checkpoint at ``uri`` to ``local_dir`` (a new temp dir by default), verified when its digest is known.

    :param uri: the checkpoint's URI, e.g. ``result["best_checkpoint_uri"]`` (``s3://...`` or a path), or an MLflow
        model version: ``models:/<name>@<alias>`` (``models:/digits@champion``) or ``models:/<name>/<version>``.
    :param local_dir: where to put its files; without it, the caller removes the new temp dir when done.
    :param expected_digest: the content digest the files must have (``result["best_checkpoint_digest"]``); a
        ``models:/`` version brings its own, proven by its experiment's Ray job.
    :param promotion: Airflow's record of the promotion that registered the checkpoint (as for
        :func:`download_model`); each file is checked against it, naming the one that differs.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment, for a ``models:/`` URI.
    :return: the local folder holding the checkpoint's files.
    """
    from airflow_tune.common.provenance import files_digest, local_file_digests
    from airflow_tune.exceptions import PromotionError

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    what, found_record = uri, None
    if is_mlflow_uri(uri):
        from airflow_tune.registries.mlflow import resolve_version

        proven = resolve_version(uri, mlflow_conn_id, ray_conn_id, promotion)
        uri, expected_digest, what, found_record = (
            proven.checkpoint_uri,
            proven.checkpoint_digest,
            proven.what,
            proven.record,
        )
    elif promotion is not None:
        found_record = _given(promotion, mlflow_conn_id)
        if uri.rstrip("/") != f"{found_record.folder}/checkpoint":
            raise ValueError(
                f"uri = {uri[:300]!r} is not the checkpoint {found_record.what} registered "
                f"({found_record.folder}/checkpoint)"
            )
    # Downloaded into a folder of its own first: what is verified is exactly what is handed over.
    staging = tempfile.mkdtemp(prefix="checkpoint-")
    try:
        storage.download_dir(uri, staging)
        found = local_file_digests(staging)
        if found_record is not None:
            _check_record(found_record, found, "checkpoint", what, uri)
        if expected_digest is not None and files_digest(found) != expected_digest:
            raise PromotionError(
                f"{what}: the files read from {uri} are not the ones its trial wrote (their content digest is not "
                f"{expected_digest}): storage was changed; refusing to hand them over"
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _hand_over(staging, local_dir)


def load_checkpoint(
    uri: str,
    *,
    expected_digest: str | None = None,
    promotion: Any = None,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> Checkpoint:
    """A ``ray.tune.Checkpoint`` on the checkpoint at ``uri``; use ``.as_directory()`` or ``.to_directory()``.

    :param uri: as for :func:`download_checkpoint`.
    :param expected_digest: as for :func:`download_checkpoint`. With a digest (or a ``models:/`` version, or
        ``promotion``) the files are downloaded and verified now, and the checkpoint is on that local copy; without
        one it reads storage lazily and unverified.
    :param promotion: as for :func:`download_checkpoint`.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment, for a ``models:/`` URI.

    Needs Ray here (the ``ray`` extra); :func:`download_checkpoint` does not.
    """
    from airflow_tune.hooks.ray_extra import RayExtraMissing, ray_installed

    if not ray_installed():
        raise RayExtraMissing(f"load_checkpoint({uri!r}) (a ray.tune.Checkpoint; download_checkpoint needs no Ray)")
    from ray.tune import Checkpoint

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    if expected_digest is not None or promotion is not None or is_mlflow_uri(uri):
        folder = download_checkpoint(
            uri,
            expected_digest=expected_digest,
            promotion=promotion,
            mlflow_conn_id=mlflow_conn_id,
            ray_conn_id=ray_conn_id,
        )
        return Checkpoint(path=folder)
    fs, path = storage.resolve(uri)
    return Checkpoint(path=path, filesystem=fs)


def download_model(
    uri: str,
    local_dir: str | None = None,
    *,
    promotion: Any = None,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> str:
    """Copy the MLflow Model of a promoted version to ``local_dir`` (a new temp dir by default), verified before
    anything is unpickled: every file (``MLmodel``, the pickled loader, its code, the requirements, the checkpoint)
    as its promotion registered it, by Airflow's record of that promotion, and the checkpoint as its trial wrote it
    (proven by its experiment's Ray job). Load it with ``mlflow.pyfunc.load_model(folder)`` (or :func:`load_model`).

    Airflow's record (:mod:`airflow_tune.registries.record`) is ``promotion``; else,
    inside an Airflow task, the XCom of the promote task instance the version names; else (a script outside Airflow)
    the digests the registry stores beside the files, with a warning: a writer of the registry can recompute those.

    :param uri: ``models:/<name>@<alias>`` or ``models:/<name>/<version>``, or an S3 registry
        ``s3://bucket/models/<name>`` (its champion). With ``promotion``, the version it registered.
    :param local_dir: where to put the model's files; without it, the caller removes the new temp dir when done.
    :param promotion: the promote task's XCom (``promote.output`` passed into a ``@task``) or the registry's Asset
        event (``context["triggering_asset_events"][asset][-1]``). An event without a source task (created through
        the REST API) or of a DAG that is not one of the registry's is refused.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment.
    :return: the local folder holding the MLflow Model.
    """
    from airflow_tune.common.provenance import files_digest, local_file_digests
    from airflow_tune.exceptions import PromotionError
    from airflow_tune.registries.mlflow_model import checkpoint_part, model_digest
    from airflow_tune.registries.record import NOT_REGISTERED

    if not isinstance(uri, str) or not uri:
        raise ValueError(
            f"uri = {uri!r}: give models:/<name>@<alias>, models:/<name>/<version> or s3://bucket/models/x"
        )
    if is_mlflow_uri(uri):
        from airflow_tune.registries.mlflow import resolve_version

        proven = resolve_version(uri, mlflow_conn_id, ray_conn_id, promotion)
        if proven.model_uri is None or proven.model_digest is None:
            raise PromotionError(
                f"{proven.what} is a bare checkpoint, not an MLflow Model (it was promoted without model_loader): "
                "download_checkpoint reads it"
            )
        model_uri, digest, checkpoint_digest, what = (
            proven.model_uri,
            proven.model_digest,
            proven.checkpoint_digest,
            proven.what,
        )
        builtin, found_record = proven.model_kind == "pyfunc", proven.record
    elif uri.startswith("s3://"):
        from airflow_tune.registry import model_of, proven_pointer

        pointer, where, found_record = proven_pointer(uri, ray_conn_id=ray_conn_id, promotion=promotion)
        model_uri, digest, checkpoint_digest, what = model_of(pointer, where)
        builtin = not model_uri.endswith("/checkpoint")
    else:
        raise ValueError(
            f"uri = {uri!r}: give models:/<name>@<alias>, models:/<name>/<version> or s3://bucket/models/x"
        )
    # The version's card and the map's copy lie beside the model's files: not part of the model.
    extra = NOT_REGISTERED if builtin else ()
    staging = tempfile.mkdtemp(prefix="model-")
    try:
        storage.download_dir(model_uri, staging)
        found = {rel: d for rel, d in local_file_digests(staging).items() if rel not in extra}
        if found_record is not None:
            _check_record(found_record, found, "" if builtin else "checkpoint", what, model_uri)
        checkpoint = checkpoint_part(found) if builtin else found
        if files_digest(checkpoint) != checkpoint_digest or (found_record is None and model_digest(found) != digest):
            raise PromotionError(
                f"{what}: the files read from {model_uri} are not the ones its trial and its promotion wrote (their "
                "content digest differs): storage was changed; refusing to hand them over"
            )
        for rel in extra:
            if os.path.exists(os.path.join(staging, rel)):
                os.remove(os.path.join(staging, rel))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _hand_over(staging, local_dir)


def load_model(
    uri: str,
    *,
    promotion: Any = None,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> Any:
    """``mlflow.pyfunc.load_model`` of the verified copy :func:`download_model` makes (kept in a temp dir, which a
    loader may read lazily): a ``PyFuncModel``, whose ``predict`` serves.

    :param uri: as for :func:`download_model`.
    :param promotion: as for :func:`download_model`.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment.
    """
    import mlflow.pyfunc

    folder = download_model(uri, promotion=promotion, mlflow_conn_id=mlflow_conn_id, ray_conn_id=ray_conn_id)
    return mlflow.pyfunc.load_model(folder)


def _given(promotion: Any, mlflow_conn_id: str) -> Promotion:
    """``promotion`` checked against the DAGs of the registry it names."""
    from airflow_tune.registries import record
    from airflow_tune.registries.owner import dags_of, read_mlflow_record, read_s3_record

    registry = record.registry_of(promotion)
    if is_mlflow_uri(registry):
        from airflow_tune.hooks.mlflow import MLflowHook
        from airflow_tune.registries.mlflow import opened, registered_model_name

        with opened(MLflowHook(mlflow_conn_id), registered_model_name(registry)) as opened_registry:
            dags = dags_of(registry, read_mlflow_record(opened_registry)[1])
    else:
        from airflow_tune.registries.s3 import s3_client

        dags = dags_of(registry, read_s3_record(s3_client(), registry))
    return record.of(promotion, registry, dags)


def _check_record(found_record: Promotion, found: dict[str, str], below: str, what: str, where: str) -> None:
    """The files downloaded from ``where`` (the version folder's ``below`` part) against Airflow's record."""
    from airflow_tune.registries import record

    stored = None
    if found_record.files is None:
        try:
            stored = storage.read_bytes(f"{found_record.folder}/{record.RECORD_FILE}")
        except (OSError, ValueError):
            stored = None
    expected = record.part(record.expected_files(found_record, stored), below)
    record.verify(expected, found, f"{what} ({found_record.what})", where)


def _hand_over(staging: str, local_dir: str | None) -> str:
    """The verified ``staging`` folder itself, or its files moved into ``local_dir`` (which may exist already)."""
    if local_dir is None:
        return staging
    os.makedirs(local_dir, exist_ok=True)
    shutil.copytree(staging, local_dir, dirs_exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    return local_dir
