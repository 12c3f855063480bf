"""Open a checkpoint in a downstream task: the best checkpoint from the URI in the XCom result, or a model version
in MLflow's Model Registry (``models:/<name>@champion``, ``models:/<name>/<version>``).

Storage and the registry are not trusted, and the caller unpickles what it gets: a registry version is believed only
when the Ray job of the experiment it names vouches for its checkpoint and content digest (see
:func:`airflow_tune.registry_mlflow.verified_source`), and the files are downloaded first and then verified, byte for
byte, against that digest (or the ``expected_digest`` given, e.g. the XCom result's ``best_checkpoint_digest``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING

from airflow_tune import storage

if TYPE_CHECKING:
    from ray.tune import Checkpoint

MODELS_PREFIX = "models:/"  # an MLflow model version: resolved through the registry (imported only then)


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
    from airflow_tune.provenance import files_digest, local_file_digests

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    what = uri
    if isinstance(uri, str) and uri.startswith(MODELS_PREFIX):
        from airflow_tune.registry_mlflow import resolve_checkpoint

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
    if local_dir is None:
        return staging
    os.makedirs(local_dir, exist_ok=True)
    shutil.copytree(staging, local_dir, dirs_exist_ok=True)
    shutil.rmtree(staging, ignore_errors=True)
    return local_dir


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
    from airflow_tune.ray_extra import RayExtraMissing, ray_installed

    if not ray_installed():
        raise RayExtraMissing(f"load_checkpoint({uri!r}) (a ray.tune.Checkpoint; download_checkpoint needs no Ray)")
    from ray.tune import Checkpoint

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    if expected_digest is not None or (isinstance(uri, str) and uri.startswith(MODELS_PREFIX)):
        folder = download_checkpoint(
            uri, expected_digest=expected_digest, mlflow_conn_id=mlflow_conn_id, ray_conn_id=ray_conn_id
        )
        return Checkpoint(path=folder)
    fs, path = storage.resolve(uri)
    return Checkpoint(path=path, filesystem=fs)
