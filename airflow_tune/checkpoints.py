"""Open a checkpoint in a downstream task: the best checkpoint from the URI in the XCom result, or a model version
in MLflow's Model Registry (``models:/<name>@champion``, ``models:/<name>/<version>``).

A registry version is believed only when airflow-tune registered it: its ``airflow_tune.checkpoint_uri`` tag equals
its source and the checkpoint's current S3 listing matches its ``airflow_tune.checkpoint_digest`` tag (checked again
after the download). The storage is not trusted: the checkpoint is unpickled by the caller.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from airflow_tune import storage

if TYPE_CHECKING:
    from ray.tune import Checkpoint

MODELS_PREFIX = "models:/"  # an MLflow model version: resolved through the registry (imported only then)


def download_checkpoint(uri: str, local_dir: str | None = None, *, mlflow_conn_id: str = "mlflow_default") -> str:
    """Copy the checkpoint at ``uri`` to ``local_dir`` (a new temp dir by default).

    :param uri: the checkpoint's URI, e.g. ``result["best_checkpoint_uri"]`` (``s3://...`` or a path), or an MLflow
        model version: ``models:/<name>@<alias>`` (``models:/digits@champion``) or ``models:/<name>/<version>``.
    :param local_dir: where to put its files; without it, the caller removes the new temp dir when done.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.
    :return: the local folder holding the checkpoint's files.
    """
    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    recheck = None
    if isinstance(uri, str) and uri.startswith(MODELS_PREFIX):
        from airflow_tune.registry_mlflow import resolve_checkpoint

        uri, recheck = resolve_checkpoint(uri, mlflow_conn_id)
    target = local_dir or tempfile.mkdtemp(prefix="checkpoint-")
    storage.download_dir(uri, target)
    if recheck is not None:
        recheck()
    return target


def load_checkpoint(uri: str, *, mlflow_conn_id: str = "mlflow_default") -> Checkpoint:
    """A ``ray.tune.Checkpoint`` on the checkpoint at ``uri``; use ``.as_directory()`` or ``.to_directory()``.

    :param uri: as for :func:`download_checkpoint`; a ``models:/`` version is verified when this is called.
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` URI.

    Needs Ray here (the ``ray`` extra); :func:`download_checkpoint` does not.
    """
    from airflow_tune.ray_extra import RayExtraMissing, ray_installed

    if not ray_installed():
        raise RayExtraMissing(f"load_checkpoint({uri!r}) (a ray.tune.Checkpoint; download_checkpoint needs no Ray)")
    from ray.tune import Checkpoint

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    if isinstance(uri, str) and uri.startswith(MODELS_PREFIX):
        from airflow_tune.registry_mlflow import resolve_checkpoint

        uri, _ = resolve_checkpoint(uri, mlflow_conn_id)
    fs, path = storage.resolve(uri)
    return Checkpoint(path=path, filesystem=fs)
