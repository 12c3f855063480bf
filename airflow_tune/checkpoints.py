"""Open the best checkpoint of an experiment from the URI in the XCom result, in a downstream task."""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING

from airflow_tune import storage

if TYPE_CHECKING:
    from ray.tune import Checkpoint


def download_checkpoint(uri: str, local_dir: str | None = None) -> str:
    """Copy the checkpoint at ``uri`` (``s3://...`` or a path) to ``local_dir`` (a new temp dir by default).

    :param uri: the checkpoint's URI, e.g. ``result["best_checkpoint_uri"]``.
    :param local_dir: where to put its files; without it, the caller removes the new temp dir when done.
    :return: the local folder holding the checkpoint's files.
    """
    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    target = local_dir or tempfile.mkdtemp(prefix="checkpoint-")
    storage.download_dir(uri, target)
    return target


def load_checkpoint(uri: str) -> Checkpoint:
    """A ``ray.tune.Checkpoint`` on the checkpoint at ``uri``; use ``.as_directory()`` or ``.to_directory()``.

    Needs Ray here (the ``ray`` extra); :func:`download_checkpoint` does not.
    """
    from airflow_tune.ray_extra import RayExtraMissing, ray_installed

    if not ray_installed():
        raise RayExtraMissing(f"load_checkpoint({uri!r}) (a ray.tune.Checkpoint; download_checkpoint needs no Ray)")
    from ray.tune import Checkpoint

    if not uri:
        raise ValueError("no checkpoint URI given: the experiment's best trial saved no checkpoint")
    fs, path = storage.resolve(uri)
    return Checkpoint(path=path, filesystem=fs)
