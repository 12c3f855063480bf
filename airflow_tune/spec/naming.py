"""Names and places: the experiment name a task instance gets, and the storage paths a spec accepts."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from airflow_tune.spec.errors import Errors

STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs", "abfss", "az")
EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}\Z")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")


def check_name(name: Any, errors: Errors) -> None:
    if not isinstance(name, str) or not EXPERIMENT_NAME.match(name) or ".." in name:
        errors.add(
            "name",
            name,
            "not a safe experiment name",
            "use 1-200 letters, digits and . _ = - (no slashes, spaces or '..'), starting with a letter or digit",
        )


def check_storage(storage: Any, errors: Errors) -> None:
    if not isinstance(storage, str):
        errors.add("storage_path", storage, "must be a string", 'give e.g. "s3://my-bucket/experiments"')
        return
    if "://" in storage:
        scheme, rest = storage.split("://", 1)
        if scheme not in STORAGE_SCHEMES:
            errors.add(
                "storage_path",
                storage,
                f"unsupported scheme {scheme!r}",
                f"use one of {', '.join(s + '://' for s in STORAGE_SCHEMES)} or an absolute path",
            )
            return
        if scheme == "file":
            if not rest.startswith("/"):
                errors.add("storage_path", storage, "file URIs need an absolute path", "write file:///abs/path")
            return
        bucket = rest.split("/", 1)[0]
        if not bucket:
            errors.add("storage_path", storage, "has no bucket", f"write {scheme}://bucket/prefix")
        elif scheme == "s3" and not _S3_BUCKET.match(bucket):
            errors.add(
                "storage_path",
                storage,
                f"{bucket!r} is not a valid S3 bucket name",
                "use 3-63 lowercase letters, digits, dots and hyphens",
            )
        if any(part in ("..", ".") for part in rest.split("/")) or " " in rest:
            errors.add("storage_path", storage, "has '.', '..' or spaces in the path", "use a plain key prefix")
        return
    if not storage.startswith("/"):
        errors.add(
            "storage_path",
            storage,
            "is a relative path or has no scheme",
            "use s3://bucket/prefix, or an absolute path that every Ray node shares",
        )


def experiment_name_for(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """A deterministic, S3-safe, readable experiment name for one task instance (the same for every try).

    Built from the run id, never from a logical date (manual and API runs have none). A short hash of the raw
    identity keeps two names apart when sanitizing makes them look alike.
    """
    raw = json.dumps([dag_id, task_id, run_id, map_index])
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]

    def clean(text: str, limit: int) -> str:
        # Each part starts and ends with a letter or digit: the name must start with one ("_dag" is a valid dag id).
        text = re.sub(r"[^A-Za-z0-9._=-]+", "-", str(text)).strip("-._=")
        text = re.sub(r"\.{2,}", ".", text)
        return text[:limit].strip("-._=") or "x"

    parts = [clean(dag_id, 60), clean(task_id, 60)]
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index)[:12])
    parts.append(clean(run_id, 50))
    return "__".join(parts) + f"-{digest}"
