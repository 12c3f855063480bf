"""Reading and writing experiment files by URI (``s3://``, ``gs://``, ``file://`` or an absolute path).

Used by the engine on the cluster and by Airflow tasks alike, through pyarrow's filesystems (the same layer Tune
writes with), so whatever Tune can write to, we can read from. S3 settings come from the environment
(``AWS_ENDPOINT_URL``, keys, region) or the instance's role. pyarrow is imported inside the functions: Airflow-side
modules import this one at DAG-parse time.

Every URI is parsed as the spec parses a storage path (:func:`airflow_tune.common.spec.naming.parse_storage_uri`): one
with userinfo, a port, a query, a fragment, ``.``/``..``/``//`` segments, escapes or odd characters is refused with a
ValueError naming it, and filesystems are built from the scheme and the bucket only.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_tune.common.spec.naming import StorageLocation, parse_storage_uri

if TYPE_CHECKING:
    import pyarrow.fs

#: How S3 requests ride out a slow or paused endpoint. A request waits this long for its next byte before it counts
#: as failed (the AWS SDK's default is 3 s, so a 20 s pause of the endpoint failed every trial), and each call is tried
#: up to ``S3_MAX_ATTEMPTS`` times. Set on the cluster's nodes (and the Airflow workers) to change them.
S3_REQUEST_TIMEOUT_ENV = "AIRFLOW_TUNE_S3_REQUEST_TIMEOUT_S"
S3_CONNECT_TIMEOUT_ENV = "AIRFLOW_TUNE_S3_CONNECT_TIMEOUT_S"
S3_MAX_ATTEMPTS_ENV = "AIRFLOW_TUNE_S3_MAX_ATTEMPTS"
S3_DEFAULTS = {S3_REQUEST_TIMEOUT_ENV: 60.0, S3_CONNECT_TIMEOUT_ENV: 10.0, S3_MAX_ATTEMPTS_ENV: 5}


def _setting(name: str) -> float:
    try:
        return float(os.environ.get(name, S3_DEFAULTS[name]))
    except ValueError:
        return float(S3_DEFAULTS[name])


@functools.lru_cache(maxsize=32)
def _filesystem(scheme: str, bucket: str, endpoint: str, settings: tuple[float, float, int]) -> pyarrow.fs.FileSystem:
    """One filesystem per bucket (resolving a bucket's region costs a request); S3 with patient timeouts."""
    import pyarrow.fs

    fs, _ = pyarrow.fs.FileSystem.from_uri(f"{scheme}://{bucket}")
    if not isinstance(fs, pyarrow.fs.S3FileSystem):
        return fs
    request_timeout, connect_timeout, attempts = settings
    # The options from_uri resolved (region, endpoint from AWS_ENDPOINT_URL, ...), as S3FileSystem takes them back.
    options = dict(fs.__reduce__()[1][0])
    options.update(request_timeout=request_timeout, connect_timeout=connect_timeout)
    return pyarrow.fs.S3FileSystem(
        **options, retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=int(attempts))
    )


def location(uri: str) -> StorageLocation:
    """``uri`` parsed as the spec parses a storage path; ValueError naming the URI when it is refused (userinfo, a
    port, a query, a fragment, ``.``/``..``/``//``, a relative path, ...; see
    :mod:`airflow_tune.common.spec.naming`)."""
    return parse_storage_uri(uri, field="storage URI")


def resolve(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """The filesystem and the scheme-less path of ``uri``.

    The filesystem is built from the scheme and the bucket only (or is the local one), never from the URI itself:
    pyarrow's ``from_uri`` would honour options in a query string (``?endpoint_override=...``) or userinfo.
    """
    import pyarrow.fs

    where = location(uri)
    if where.scheme == "file":
        return pyarrow.fs.LocalFileSystem(), where.path
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    settings = (_setting(S3_REQUEST_TIMEOUT_ENV), _setting(S3_CONNECT_TIMEOUT_ENV), int(_setting(S3_MAX_ATTEMPTS_ENV)))
    return _filesystem(where.scheme, where.bucket, endpoint, settings), where.path


def tune_storage(storage_path: str) -> tuple[str, pyarrow.fs.FileSystem | None]:
    """What to give Tune as ``storage_path`` and ``storage_filesystem``: an object store through :func:`resolve`'s
    patient filesystem (Tune wants the path without its scheme then); a local path in its canonical form
    (``file:///abs/path`` for a ``file://`` URI, ``/abs/path`` for a plain one), which Tune resolves itself."""
    where = location(storage_path)
    if where.scheme == "file":
        return (where.uri if "://" in storage_path else where.path), None
    fs, path = resolve(storage_path)
    return path, fs


def with_scheme(storage_uri: str, path: str) -> str:
    """Put back the scheme that Tune's paths lose (``bucket/exp/ckpt`` -> ``s3://bucket/exp/ckpt``)."""
    if "://" in path:
        return path
    if "://" not in storage_uri:
        return path
    scheme = storage_uri.split("://", 1)[0].lower()
    if scheme == "file":
        return f"file://{path}"
    return f"{scheme}://{path.lstrip('/')}"


def exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = resolve(uri)
    return bool(fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound)


def read_bytes(uri: str) -> bytes:
    fs, path = resolve(uri)
    with fs.open_input_stream(path) as stream:
        return bytes(stream.read())


def read_bytes_or_none(uri: str) -> bytes | None:
    """A whole file's bytes, or None when there is no file at ``uri``."""
    try:
        return read_bytes(uri)
    except FileNotFoundError:
        return None


#: How many times a JSON file is read before one that does not parse counts as malformed, and the first pause
#: between reads (doubled each time: 0.3 s in all).
JSON_READ_ATTEMPTS = 5
JSON_REREAD_PAUSE_S = 0.02


def _version(info: pyarrow.fs.FileInfo) -> tuple[Any, Any]:
    return info.mtime_ns, info.size


def _read_json_file(fs: pyarrow.fs.FileSystem, path: str, info: pyarrow.fs.FileInfo) -> tuple[Any, Any]:
    """The JSON of ``path`` whose ``info`` was just read, and the version it was read at.

    pyarrow reads an object as a HEAD for its size and then ranged GETs: a file replaced in between (``progress.json``,
    rewritten while it is polled) can come back cut short or spliced from two versions. Such a torn read does not
    parse, and the file is read again after a pause; object stores give no version to compare that the replacement
    is sure to change (a modification time is whole seconds on some), so only a file that still does not parse after
    :data:`JSON_READ_ATTEMPTS` reads is malformed, and that error is raised.
    """
    import time

    import pyarrow.fs

    for attempt in range(JSON_READ_ATTEMPTS):
        with fs.open_input_stream(path) as stream:
            data = stream.read()
        try:
            return json.loads(data), _version(info)
        except ValueError:
            if attempt == JSON_READ_ATTEMPTS - 1:
                raise
        time.sleep(JSON_REREAD_PAUSE_S * 2**attempt)
        info = fs.get_file_info(path)
        if info.type == pyarrow.fs.FileType.NotFound:
            raise FileNotFoundError(f"{path} was deleted while it was read")
    raise AssertionError("unreachable")  # pragma: no cover


def read_json(uri: str) -> Any:
    import pyarrow.fs

    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        raise FileNotFoundError(f"no file at {uri}")
    return _read_json_file(fs, path, info)[0]


def read_json_or_none(uri: str) -> Any:
    import pyarrow.fs

    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return None
    return _read_json_file(fs, path, info)[0]


def read_json_if_changed(uri: str, seen: Any) -> tuple[Any, Any]:
    """``(data, version)`` of a JSON file, or ``(None, version)`` when its version is ``seen`` (or it does not
    exist): one HEAD request while nothing changed, a GET only when it did. The version is the file's mtime and
    size."""
    import pyarrow.fs

    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pyarrow.fs.FileType.NotFound:
        return None, None
    if _version(info) == seen:
        return None, seen
    return _read_json_file(fs, path, info)


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object. S3 puts are atomic: a reader sees the old or the new content, never half; a local file
    (a path or ``file://``) is written beside its place and moved there, its folders made first."""
    fs, path = resolve(uri)
    if location(uri).scheme == "file":
        fs.create_dir(path.rsplit("/", 1)[0] or "/", recursive=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def write_json(uri: str, data: Any) -> None:
    """Write ``data`` as strict JSON (NaN and infinities as the strings "NaN", "Infinity", "-Infinity")."""
    from airflow_tune.common import jsonsafe

    write_bytes(uri, jsonsafe.dumps(data, indent=1, sort_keys=True).encode())


def list_files(uri: str) -> list[str]:
    """Every file below ``uri``, as full URIs (pyarrow's 0-byte folder markers left out)."""
    import pyarrow.fs

    fs, path = resolve(uri)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(with_scheme(uri, info.path) for info in infos if info.type == pyarrow.fs.FileType.File)


def glob_names(uri: str, prefix: str) -> list[str]:
    """Names directly below ``uri`` that start with ``prefix``."""
    import pyarrow.fs

    fs, path = resolve(uri)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=False, allow_not_found=True))
    return sorted(info.base_name for info in infos if info.base_name.startswith(prefix))


def download_dir(uri: str, local_dir: str) -> str:
    """Copy everything below ``uri`` into ``local_dir``; return ``local_dir``."""
    import pyarrow.fs

    fs, path = resolve(uri)
    os.makedirs(local_dir, exist_ok=True)
    pyarrow.fs.copy_files(path, local_dir, source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
    return local_dir


def file_digests(uri: str, *, recursive: bool = True) -> dict[str, str]:
    """``{relative path: "sha256:<hex>"}`` of every file below ``uri`` (pyarrow's 0-byte folder markers left out),
    each streamed once; with ``recursive=False``, of the files directly in it."""
    import pyarrow.fs

    from airflow_tune.common.provenance import CHUNK, digest_stream

    fs, path = resolve(uri)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(path, recursive=recursive, allow_not_found=True))
    out: dict[str, str] = {}
    for info in infos:
        if info.type != pyarrow.fs.FileType.File:
            continue
        out[info.path[len(path.rstrip("/")) + 1 :]] = digest_stream(_chunks(fs, info.path, CHUNK))
    return out


def _chunks(fs: pyarrow.fs.FileSystem, path: str, size: int) -> Iterator[bytes]:
    with fs.open_input_stream(path) as stream:
        while chunk := stream.read(size):
            yield bytes(chunk)
