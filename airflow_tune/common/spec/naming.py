"""Names and places: the experiment name a task instance gets, and the storage paths a spec accepts.

A storage path is where the engine reads its spec back, where Tune unpickles ``tuner.pkl`` and where ``result.json``
comes from, so it is parsed, not matched: :func:`parse_storage_uri` accepts ``s3://bucket/key/prefix``,
``gs://bucket/prefix`` (``gcs://`` is the same), ``file:///abs/path`` and a plain absolute path (the same as its
``file://`` form), and refuses, naming the problem and the fix:

- userinfo (``s3://user:pw@bucket``), a port (``s3://bucket:9000``), any authority that is not a plain bucket name
  (``file://`` takes none), a query string (``?endpoint_override=...``: pyarrow would honour it) and a fragment;
- ``.``, ``..`` and empty segments (``//``; one trailing slash is dropped), the filesystem root as a local path;
- backslashes, whitespace, control and format characters, and every ``%`` (layers disagree on decoding: pyarrow's
  ``from_uri`` decodes ``%2e%2e`` to ``..``, S3 keeps it as written, so no escape is given a meaning at all);
- ``hdfs://``, ``abfs://``, ``abfss://`` and ``az://``: their authority names a server or an account and carries
  ports, credentials or options in forms we cannot confine to a bucket, and no Ray cluster here tests them.

:func:`normalize_storage_uri` gives the canonical form (scheme in lower case, ``gcs`` as ``gs``, no trailing slash,
an absolute path as ``file:///...``) and :func:`is_under` compares canonical forms segment by segment.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from airflow_tune.common.spec.errors import Errors, show

#: A metric's name: it reaches task logs, the Experiment view, MLflow and lineage, so the spec keeps to the names
#: Tune's own examples use (``loss``, ``mean_accuracy``, ``val/loss``, ``acc-top1``); Tune itself takes any string.
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*\Z")

#: Schemes a storage path may use (a plain absolute path is a local one, like ``file://``).
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file")
#: Schemes refused, each with the reason (see the module docstring).
UNCONFINED_SCHEMES = {
    "hdfs": "its authority is a namenode host and port of the URI's choosing",
    "abfs": "its authority names an Azure account and container, and the URI may carry keys and options",
    "abfss": "its authority names an Azure account and container, and the URI may carry keys and options",
    "az": "its authority names an Azure account and container, and the URI may carry keys and options",
}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*\Z")
EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,199}\Z")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
_BUCKET_RULES = {
    "s3": (_S3_BUCKET, "S3 bucket", "use 3-63 lowercase letters, digits, dots and hyphens"),
    "gs": (_GCS_BUCKET, "GCS bucket", "use 3-63 lowercase letters, digits, dots, hyphens and underscores"),
}
_GOOD_PATH = "use a plain key prefix, e.g. s3://bucket/experiments/team-a"


class StorageURIError(ValueError):
    """A storage URI refused by :func:`parse_storage_uri`: ``problem`` and ``fix`` say why and what to write."""

    def __init__(self, uri: Any, problem: str, fix: str, field: str = "storage_path") -> None:
        self.uri, self.problem, self.fix, self.field = uri, problem, fix, field
        super().__init__(f"{field} = {show(uri)}: {problem}; {fix}")

    def __reduce__(self) -> tuple[type[StorageURIError], tuple[Any, str, str, str]]:
        return (type(self), (self.uri, self.problem, self.fix, self.field))


@dataclass(frozen=True)
class StorageLocation:
    """A parsed storage URI: ``scheme`` (``s3``, ``gs`` or ``file``), ``bucket`` (empty for ``file``), and the path's
    ``segments`` (none, ``.``, ``..`` or empty)."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    @property
    def uri(self) -> str:
        """The canonical form: ``s3://bucket/a/b``, ``gs://bucket``, ``file:///a/b``."""
        if self.scheme == "file":
            return "file:///" + "/".join(self.segments)
        return f"{self.scheme}://{self.bucket}" + "".join(f"/{s}" for s in self.segments)

    @property
    def path(self) -> str:
        """The path a pyarrow filesystem of this scheme (and bucket) takes: ``bucket/a/b`` or ``/a/b``."""
        if self.scheme == "file":
            return "/" + "/".join(self.segments)
        return "/".join((self.bucket, *self.segments))

    def is_under(self, root: StorageLocation) -> bool:
        n = len(root.segments)
        return (self.scheme, self.bucket) == (root.scheme, root.bucket) and self.segments[:n] == root.segments


def _bad_character(text: str) -> str | None:
    for index, char in enumerate(text):
        if char == "\\":
            return f"has a backslash ({index})"
        if char == "%":
            return f"has a percent-escape ({text[index : index + 3]!r} at {index}), which some readers decode"
        category = unicodedata.category(char)
        if category[0] in "CZ":  # controls, formats, unassigned, surrogates; spaces and other separators
            what = "a space" if char == " " else f"whitespace or a control character ({char!r})"
            return f"has {what} at {index}: no spaces or control characters in storage paths"
    return None


def _segments(uri: str, path: str, field: str, *, local: bool) -> tuple[str, ...]:
    """The segments of ``path`` (which starts with ``/``, or is empty for a bucket's root)."""
    if path.endswith("/") and path != "/":
        path = path[:-1]  # one trailing slash means the same folder
    parts = tuple(path[1:].split("/")) if path not in ("", "/") else ()
    if local and not parts:
        raise StorageURIError(uri, "is the filesystem's root", "name a folder, e.g. file:///shared/experiments", field)
    for part in parts:
        if part in ("", ".", ".."):
            shown = "an empty segment ('//')" if part == "" else f"a {part!r} segment"
            raise StorageURIError(uri, f"has {shown}: '.', '..' and '//' are refused", _GOOD_PATH, field)
    return parts


def parse_storage_uri(uri: Any, field: str = "storage_path") -> StorageLocation:
    """Parse a storage path, or raise :class:`StorageURIError` naming ``field``, the value, the problem and the fix."""
    if not isinstance(uri, str):
        raise StorageURIError(uri, "must be a string", 'give e.g. "s3://my-bucket/experiments"', field)
    bad = _bad_character(uri)
    if bad:
        raise StorageURIError(uri, bad, _GOOD_PATH, field)
    if "://" not in uri:
        if not uri.startswith("/"):
            raise StorageURIError(
                uri,
                "is a relative path or has no scheme",
                "use s3://bucket/prefix, or an absolute path that every Ray node shares",
                field,
            )
        _refuse_query_and_fragment(uri, field)
        return StorageLocation("file", "", _segments(uri, uri, field, local=True))
    scheme, rest = uri.split("://", 1)
    lowered = scheme.lower()
    if lowered in UNCONFINED_SCHEMES:
        raise StorageURIError(
            uri,
            f"{scheme}:// is not supported as storage: {UNCONFINED_SCHEMES[lowered]}, which cannot be confined to "
            "a storage root",
            "use s3://bucket/prefix, gs://bucket/prefix, or a shared filesystem as file:///abs/path",
            field,
        )
    if not _SCHEME.match(scheme) or lowered not in STORAGE_SCHEMES:
        raise StorageURIError(
            uri,
            f"unsupported scheme {scheme!r}",
            f"use one of {', '.join(s + '://' for s in STORAGE_SCHEMES)} or an absolute path",
            field,
        )
    _refuse_query_and_fragment(uri, field)
    authority, slash, path = rest.partition("/")
    path = slash + path
    if lowered == "file":
        if authority:
            raise StorageURIError(
                uri, "file URIs need an absolute path and no host", "write file:///abs/path (three slashes)", field
            )
        return StorageLocation("file", "", _segments(uri, path, field, local=True))
    scheme = "gs" if lowered == "gcs" else lowered
    if not authority:
        raise StorageURIError(uri, "has no bucket", f"write {lowered}://bucket/prefix", field)
    if "@" in authority:
        raise StorageURIError(
            uri,
            "has userinfo (credentials before '@') in its authority",
            f"write {lowered}://bucket/prefix; the cluster and the workers take credentials from their environment",
            field,
        )
    if ":" in authority:
        raise StorageURIError(
            uri,
            "has a port in its authority",
            f"write {lowered}://bucket/prefix; the endpoint comes from the environment (AWS_ENDPOINT_URL), not the URI",
            field,
        )
    pattern, kind, fix = _BUCKET_RULES[scheme]
    if not pattern.match(authority) or ".." in authority:
        raise StorageURIError(uri, f"{authority!r} is not a valid {kind} name", fix, field)
    return StorageLocation(scheme, authority, _segments(uri, path, field, local=False))


def _refuse_query_and_fragment(uri: str, field: str) -> None:
    if "?" in uri:
        raise StorageURIError(
            uri, "has a query string ('?...'), which could set the filesystem's options", _GOOD_PATH, field
        )
    if "#" in uri:
        raise StorageURIError(
            uri, "has a fragment ('#...'), which would swallow the experiment's path", _GOOD_PATH, field
        )


def normalize_storage_uri(uri: Any, field: str = "storage_path") -> str:
    """The canonical form of a storage path (see the module docstring); raises :class:`StorageURIError`."""
    return parse_storage_uri(uri, field).uri


def is_under(uri: str, root: str) -> bool:
    """Whether ``uri`` lies at or below ``root``: same scheme, same bucket, root's segments a prefix of uri's.

    Both are parsed first (:class:`StorageURIError` when either is refused), so ``s3://b/exp`` is not under
    ``s3://b/ex``, and ``/data/x`` is under ``file:///data``.
    """
    return parse_storage_uri(uri).is_under(parse_storage_uri(root, "root"))


def check_name(name: Any, errors: Errors) -> None:
    if not isinstance(name, str) or not EXPERIMENT_NAME.match(name) or ".." in name:
        errors.add(
            "name",
            name,
            "not a safe experiment name",
            "use 1-200 letters, digits and . _ = - (no slashes, spaces or '..'), starting with a letter or digit",
        )


def check_storage(storage: Any, errors: Errors) -> None:
    try:
        parse_storage_uri(storage)
    except StorageURIError as exc:
        errors.add("storage_path", storage, exc.problem, exc.fix)


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
