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


def download_checkpoint(
    uri: str,
    local_dir: str | None = None,
    *,
    expected_digest: str | None = None,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> str:
    """Copy the checkpoint at ``uri`` to ``local_dir`` (a new temp dir by default), verified when its digest is known.

    :param uri: the checkpoint's URI, e.g. ``result["best_checkpoint_uri"]`` (``s3://...`` or a path), or an MLflow
        model version: ``models:/<name>@<alias>`` (``models:/digits@champion``) or ``models:/<name>/<version>``.
    :param local_dir: where to put its files; without it, the caller removes the new temp dir when done.
    :param expected_digest: the content digest the files must have (``result["best_checkpoint_digest"]``); a
        ``models:/`` version brings its own, proven by its experiment's Ray job.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment, for a ``models:/`` URI.
    :return: the local folder holding the checkpoint's files.
    """
    from airflow_tune.common.provenance import files_digest, local_file_digests

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    what = uri
    if is_mlflow_uri(uri):
        from airflow_tune.registries.mlflow import resolve_checkpoint

        uri, expected_digest, what = resolve_checkpoint(uri, mlflow_conn_id, ray_conn_id)
    # Downloaded into a folder of its own first: what is verified is exactly what is handed over.
    staging = tempfile.mkdtemp(prefix="checkpoint-")
    try:
        storage.download_dir(uri, staging)
        if expected_digest is not None and files_digest(local_file_digests(staging)) != expected_digest:
            from airflow_tune.exceptions import PromotionError

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
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> Checkpoint:
    """A ``ray.tune.Checkpoint`` on the checkpoint at ``uri``; use ``.as_directory()`` or ``.to_directory()``.

    :param uri: as for :func:`download_checkpoint`.
    :param expected_digest: as for :func:`download_checkpoint`. With a digest (or a ``models:/`` version) the files
        are downloaded and verified now, and the checkpoint is on that local copy; without one it reads storage
        lazily and unverified.
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
    if expected_digest is not None or is_mlflow_uri(uri):
        folder = download_checkpoint(
            uri, expected_digest=expected_digest, mlflow_conn_id=mlflow_conn_id, ray_conn_id=ray_conn_id
        )
        return Checkpoint(path=folder)
    fs, path = storage.resolve(uri)
    return Checkpoint(path=path, filesystem=fs)


def download_model(
    uri: str,
    local_dir: str | None = None,
    *,
    mlflow_conn_id: str = "mlflow_default",
    ray_conn_id: str = "ray_default",
) -> str:
    """Copy the MLflow Model of a promoted version to ``local_dir`` (a new temp dir by default), verified: the
    checkpoint inside it byte for byte as its trial wrote it (proven by its experiment's Ray job), and every other
    file (``MLmodel``, the pickled loader, its code, the requirements) as the promotion wrote it (the digest the
    registry records). Load it with ``mlflow.pyfunc.load_model(folder)`` (or :func:`load_model`).

    :param uri: ``models:/<name>@<alias>`` or ``models:/<name>/<version>``, or an S3 registry
        ``s3://bucket/models/<name>`` (its champion).
    :param local_dir: where to put the model's files; without it, the caller removes the new temp dir when done.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment.
    :return: the local folder holding the MLflow Model.
    """
    from airflow_tune.common.provenance import files_digest, local_file_digests
    from airflow_tune.exceptions import PromotionError
    from airflow_tune.registries.mlflow_model import checkpoint_part, model_digest

    if not isinstance(uri, str) or not uri:
        raise ValueError(
            f"uri = {uri!r}: give models:/<name>@<alias>, models:/<name>/<version> or s3://bucket/models/x"
        )
    extra: tuple[str, ...] = ()
    if is_mlflow_uri(uri):
        from airflow_tune.registries.mlflow import resolve_version

        proven = resolve_version(uri, mlflow_conn_id, ray_conn_id)
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
        builtin = proven.model_kind == "pyfunc"
    elif uri.startswith("s3://"):
        from airflow_tune.registry import champion_model

        model_uri, digest, checkpoint_digest, what = champion_model(uri, ray_conn_id=ray_conn_id)
        builtin = not model_uri.endswith("/checkpoint")
        extra = ("model.json",)  # the version's card, beside the model's files
    else:
        raise ValueError(
            f"uri = {uri!r}: give models:/<name>@<alias>, models:/<name>/<version> or s3://bucket/models/x"
        )
    staging = tempfile.mkdtemp(prefix="model-")
    try:
        storage.download_dir(model_uri, staging)
        found = {rel: d for rel, d in local_file_digests(staging).items() if rel not in extra}
        checkpoint = checkpoint_part(found) if builtin else found
        if files_digest(checkpoint) != checkpoint_digest or model_digest(found) != digest:
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


def load_model(uri: str, *, mlflow_conn_id: str = "mlflow_default", ray_conn_id: str = "ray_default") -> Any:
    """``mlflow.pyfunc.load_model`` of the verified copy :func:`download_model` makes (kept in a temp dir, which a
    loader may read lazily): a ``PyFuncModel``, whose ``predict`` serves.

    :param uri: as for :func:`download_model`.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :param ray_conn_id: the Ray cluster that ran the version's experiment.
    """
    import mlflow.pyfunc

    return mlflow.pyfunc.load_model(download_model(uri, mlflow_conn_id=mlflow_conn_id, ray_conn_id=ray_conn_id))


def _hand_over(staging: str, local_dir: str | None) -> str:
    """The verified ``staging`` folder itself, or its files moved into ``local_dir`` (which may exist already)."""
    if local_dir is None:
        return staging
    os.makedirs(local_dir, exist_ok=True)
    shutil.copytree(staging, local_dir, dirs_exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    return local_dir
