"""Experiments are disjoint: an experiment's folder lies inside no other experiment's folder or model registry's
folder, and holds none. RayTuneOperator checks it before anything of an experiment is written or submitted.

Why: a storage path or an experiment name may come from rendering (a Param, a conf). :mod:`airflow_tune.trust.roots`
keeps it under a root, but under a root a conf could still aim one experiment into another (into its trial folders or
its best checkpoint's folder, whose content digests then change, so that DAG's deploys fail), around another, or into or
around an S3 model registry, mixing their files.

What is recognised. An experiment's folder holds :data:`~airflow_tune.common.contract.MANIFEST_DIR`
(``.airflow_tune/``): the operator writes a job's spec there before anything else of the experiment exists. A registry's
folder (S3 only,
as registries are; never a bucket's top) holds ``champion.json``, or ``versions/<version>/`` with ``model.json`` or
``checkpoint/`` in it (:mod:`airflow_tune.registries.s3`'s layout; a ``versions/`` of other shapes is someone's data).

The check, for the experiment folder ``F = <storage_path>/<experiment_name>``:

- no segment of ``F`` is ``.airflow_tune`` (nothing goes inside an experiment's manifests);
- ancestors (``F`` inside another): every folder above ``F`` is probed, from the first below the bucket's top (or
  the filesystem's root) down to the storage path, with single-key requests (S3: a ``ListObjectsV2`` of one key for
  ``.airflow_tune/`` and for ``versions/``, a ``HEAD`` of ``champion.json``): three per level, whatever the store
  holds. Levels above the storage root are probed too (an experiment whose folder holds the root); one there that
  the credentials may not read is skipped and logged, as a deployment may confine listing to its root;
- descendants (``F`` holds another): only while ``F`` has no ``.airflow_tune/`` of its own, i.e. before the
  experiment's first write. One listing of ``F``'s prefix, a page (1,000 keys) at a time, stopping at the first key
  below an ``.airflow_tune`` folder or of a registry's shape, and at :data:`DESCENDANT_KEYS` keys at most. A new
  experiment's folder normally holds nothing (one request); one holding more than that is refused, not guessed at.

Why this is enough, and why the bounded listing is sound:

1. Of two nested experiments, the one created second is refused. If the outer one came first, the inner one's
   ancestor probe finds its ``.airflow_tune/``: every level is probed, none sampled. If the inner one came first,
   the outer one's folder was new when it was checked, and its listing either reached the inner one's manifests or
   was refused for its size.
2. A retry skips the listing: everything now below ``F`` arrived after ``F``'s first write, when ``F``'s manifests
   existed, so an experiment started there since found ``F`` among its ancestors and was refused; what was below
   ``F`` before was looked for when ``F``'s first job was submitted.
3. What can still be missed: two experiments checked in the same instant, each before the other's first write
   (a store has no conditional create of a prefix; the window is the time from the check to the job spec's write);
   a registry a promote task writes inside an experiment after its first write (promotion does not run this check);
   files written by whoever holds the bucket's credentials. None of it is read as ``F``'s: the Airflow side and the
   engine read ``F``'s manifests by name (``spec.json``, ``result.json``, the job spec whose digest the entrypoint
   carries); Tune reads the files it wrote, by names it chose (``tuner.pkl``, ``experiment_state-*``), and its
   trials' folders, named with ids drawn when the trials start (nothing placed earlier is inside them); a checkpoint
   is handed on only with the content digests the engine took when it sealed the result, and a deploy verifies the
   bytes against them. So a folder we fail to find below ``F`` can at worst make ``F``'s deploys fail (a file put in
   its checkpoint's folder after the seal), never make a task load it. What the bound protects is the other side
   (its files mixed into ``F``, its next try refused by its own ancestor probe), so past the bound the folder is
   refused rather than passed.

Refusals name the field at fault (``storage_path`` for an ancestor, ``experiment_name`` for what ``F`` holds), the
conflicting folder and its owner as :func:`~airflow_tune.common.contract.describe_owner` shows it (a registry: the DAG
its ``owner.json`` names), never a value of the other experiment's spec, and the fix.

Imports neither airflow nor ray at module level; boto3 and pyarrow are imported when a store is built.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from airflow_tune.common.contract import MANIFEST_DIR, RESULT_FILE, SPEC_FILE, describe_owner
from airflow_tune.common.spec.errors import show
from airflow_tune.common.spec.naming import StorageLocation, parse_storage_uri

#: A registry's layout (airflow_tune.registries.s3.CHAMPION_FILE, its versions; the registry's owner record).
CHAMPION_FILE, VERSIONS_DIR, MODEL_FILE, CHECKPOINT_DIR = "champion.json", "versions", "model.json", "checkpoint"
REGISTRY_OWNER_FILE = "owner.json"
#: How many keys below a new experiment's folder are looked at, and S3's page size.
DESCENDANT_KEYS, PAGE_KEYS = 5_000, 1_000
#: How much of another experiment's or registry's record is read to name its owner.
RECORD_BYTES = 256 * 1024

Path = tuple[str, ...]
#: What :func:`first_nested` returns when the folder holds more keys than it may look at.
TOO_MANY = ("too many", ())


class NestedFolderError(ValueError):
    """An experiment folder inside another experiment's or a registry's folder, or holding one."""


class Store(Protocol):
    """What the check asks of a bucket or filesystem, by path segments below its top; failures are OSError."""

    registries: bool  # whether registries can live here (S3)

    def first_below(self, folder: Path) -> Path | None: ...  # one key below ``folder`` (relative), if any

    def is_file(self, path: Path) -> bool: ...

    def walk(self, folder: Path) -> Iterator[Path]: ...  # keys below ``folder`` (relative), lazily

    def read(self, path: Path, limit: int) -> bytes | None: ...


# -- the rule ----------------------------------------------------------------------------------------------------------
def check_experiment_folder(
    storage_path: str, name: str, root: str | None = None, *, store: Store | None = None, log: Any = None
) -> None:
    """Refuse the experiment folder ``<storage_path>/<name>`` when it lies inside or holds another experiment's or
    a registry's folder (see the module docstring).

    :param root: the storage root that admitted ``storage_path`` (:func:`airflow_tune.trust.roots.check_storage_path`):
        levels above it that cannot be read are skipped; None reads every level or fails.
    :param store: the bucket or filesystem (by default :func:`store_for` the folder's).
    :raises NestedFolderError: naming the field, the conflicting folder and its owner, and the fix.
    :raises ExperimentStorageError: storage at or below the root could not be read.
    """
    folder = parse_storage_uri(f"{storage_path.rstrip('/')}/{name}")
    if MANIFEST_DIR in folder.segments:
        raise NestedFolderError(
            f"storage_path = {show(storage_path)}: has a {MANIFEST_DIR!r} segment, the folder of an experiment's "
            "manifests; no experiment goes inside one. Choose a storage_path without it"
        )
    store = store if store is not None else store_for(folder)
    readable_from = _root_depth(folder, root)
    segments = folder.segments
    for depth in range(1, len(segments)):
        above = segments[:depth]
        try:
            kind = ancestor_kind(store, above)
        except OSError as exc:
            if depth < readable_from:
                if log is not None:
                    where = _uri(folder, above)
                    log.warning("Not looking for experiments in %s, above the storage root: %s", where, exc)
                continue
            raise _storage_error(folder, exc) from exc
        if kind is not None:
            raise _refusal("storage_path", storage_path, folder, "inside", kind, above, _owner(store, kind, above))
    try:
        if store.first_below((*segments, MANIFEST_DIR)) is not None:
            return  # this experiment's folder, from an earlier try: what is below it was looked at then
        found = first_nested(store.walk(segments), store.registries, DESCENDANT_KEYS)
    except OSError as exc:
        raise _storage_error(folder, exc) from exc
    if found == TOO_MANY:
        raise NestedFolderError(
            f"experiment_name = {show(name)}: the experiment folder {folder.uri} is new but already holds more than "
            f"{DESCENDANT_KEYS} objects, too many to look through for other experiments and registries. Choose an "
            "experiment_name (or a storage_path) whose folder holds nothing yet"
        )
    if found is not None:
        kind, below = found
        inner = (*segments, *below)
        raise _refusal("experiment_name", name, folder, "holds", kind, inner, _owner(store, kind, inner))


def ancestor_kind(store: Store, folder: Path) -> str | None:
    """``"experiment"`` or ``"registry"`` when ``folder`` is one's, else None (three requests at most)."""
    if store.first_below((*folder, MANIFEST_DIR)) is not None:
        return "experiment"
    if not store.registries:
        return None
    if store.is_file((*folder, CHAMPION_FILE)):
        return "registry"
    first = store.first_below((*folder, VERSIONS_DIR))
    return "registry" if first is not None and registry_version_key(first) else None


def registry_version_key(below_versions: Path) -> bool:
    """Whether a key below ``versions/`` has a registry's shape: ``<v>/model.json`` or ``<v>/checkpoint/...``."""
    if len(below_versions) < 2 or not below_versions[0]:
        return False
    return (len(below_versions) == 2 and below_versions[1] == MODEL_FILE) or (
        len(below_versions) > 2 and below_versions[1] == CHECKPOINT_DIR
    )


def nested_in(key: Path, registries: bool) -> tuple[str, Path] | None:
    """What the key ``key`` (relative to an experiment's folder) shows: ``("experiment", folder)`` when it lies in
    another experiment's manifests, ``("registry", folder)`` when it is a registry's file (``folder`` relative, the
    outermost first; ``()``: the folder itself), None for anything else and for the folder's own manifests."""
    for index, part in enumerate(key[:-1]):
        if part == MANIFEST_DIR:
            return ("experiment", key[:index]) if index else None
        if registries and part == VERSIONS_DIR and registry_version_key(key[index + 1 :]):
            return "registry", key[:index]
    if registries and key and key[-1] == CHAMPION_FILE:
        return "registry", key[:-1]
    return None


def first_nested(keys: Iterator[Path], registries: bool, limit: int) -> tuple[str, Path] | None:
    """The first of ``keys`` that shows a nested experiment or registry (:func:`nested_in`); ``TOO_MANY`` when
    ``limit`` keys showed none and more follow; None when there are no more. Reads at most ``limit + 1`` keys."""
    for count, key in enumerate(keys):
        if count == limit:
            return TOO_MANY
        found = nested_in(key, registries)
        if found is not None:
            return found
    return None


# -- owners and messages -----------------------------------------------------------------------------------------------
def _owner(store: Store, kind: str, folder: Path) -> str:
    """Who owns the experiment or registry at ``folder``, as a refusal shows it; never raises."""
    try:
        if kind == "registry":
            record = _json(store.read((*folder, REGISTRY_OWNER_FILE), RECORD_BYTES))
            dags = record.get("dags") if isinstance(record, Mapping) else None
            if isinstance(dags, Mapping) and dags:  # {dag id: its list}: the DAGs that promoted into it
                return "DAG(s) " + ", ".join(repr(str(d)[:250]) for d in sorted(dags)[:5])
            dag_id = record.get("dag_id") if isinstance(record, Mapping) else None  # a record from before
            return f"DAG {str(dag_id)[:250]!r}" if isinstance(dag_id, str) and dag_id else describe_owner(None)
        manifests = (*folder, MANIFEST_DIR)
        for name in (SPEC_FILE, RESULT_FILE):
            record = _json(store.read((*manifests, name), RECORD_BYTES))
            if isinstance(record, Mapping) and isinstance(record.get("owner"), Mapping):
                return describe_owner(record["owner"])
        job = store.first_below((*manifests, "jobs"))
        record = _json(store.read((*manifests, "jobs", *job), RECORD_BYTES)) if job is not None else None
        return describe_owner(record.get("owner") if isinstance(record, Mapping) else None)
    except OSError:
        return "an owner that could not be read"


def _json(data: bytes | None) -> Any:
    try:
        return json.loads(data) if data is not None else None
    except ValueError:
        return None


def _refusal(
    field: str, value: str, folder: StorageLocation, relation: str, kind: str, other: Path, owner: str
) -> NestedFolderError:
    where = _uri(folder, other)
    what = "another experiment" if kind == "experiment" else "a model registry"
    if relation == "inside":
        told = f"the experiment folder {folder.uri} would lie inside the folder of {what}, {where} ({owner})"
        fix = f"Choose a storage_path outside {where} (beside it, for instance)"
    elif other == folder.segments:
        told = f"the experiment folder {folder.uri} is the folder of {what} ({owner})"
        fix = "Choose an experiment_name (or a storage_path) whose folder is no registry's"
    else:
        told = f"the experiment folder {folder.uri} holds the folder of {what}, {where} ({owner})"
        fix = "Choose an experiment_name (or a storage_path) whose folder holds no experiment and no registry"
    harm = (
        "one inside another changes its files (a checkpoint's content digests, which its deploys verify) and mixes "
        "theirs"
        if kind == "experiment"
        else "an experiment inside a registry changes its versions (their content digests, which deploys verify), "
        "and a registry inside an experiment mixes their files"
    )
    return NestedFolderError(
        f"{field} = {show(value)}: {told}. Experiments are disjoint and keep out of registries: {harm}. {fix}"
    )


def _storage_error(folder: StorageLocation, exc: BaseException) -> Exception:
    from airflow_tune.exceptions import ExperimentStorageError

    return ExperimentStorageError(
        f"cannot look for other experiments and registries around the experiment folder {folder.uri} ({exc}); check "
        "that Airflow workers may list the bucket of storage_path"
    )


def _uri(folder: StorageLocation, segments: Path) -> str:
    return StorageLocation(folder.scheme, folder.bucket, tuple(segments)).uri


def _root_depth(folder: StorageLocation, root: str | None) -> int:
    """How many of the folder's leading levels lie above ``root`` (0: every level must be read)."""
    if root is None:
        return 0
    try:
        admitting = parse_storage_uri(root, "root")
    except ValueError:
        return 0
    return len(admitting.segments) if folder.is_under(admitting) else 0


# -- stores ------------------------------------------------------------------------------------------------------------
def store_for(folder: StorageLocation) -> Store:
    """The store of ``folder``: S3 through boto3 (the environment's credentials and ``AWS_ENDPOINT_URL``, as
    pyarrow's), a page at a time; a local folder or GCS through pyarrow (a GCS listing is fetched whole)."""
    return S3Store(folder.bucket) if folder.scheme == "s3" else ArrowStore(folder)


class S3Store:
    registries = True

    def __init__(self, bucket: str, client: Any = None) -> None:
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.bucket, self.client = bucket, client

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except Exception as exc:
            code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                return None  # nothing there (a missing bucket holds nothing: the first write says it is missing)
            raise OSError(f"S3 {method} in bucket {self.bucket}: {exc}") from exc

    def first_below(self, folder: Path) -> Path | None:
        prefix = "/".join(folder) + "/" if folder else ""
        answer = self._call("list_objects_v2", Prefix=prefix, MaxKeys=1) or {}
        keys = [o["Key"] for o in answer.get("Contents", [])]
        return tuple(keys[0][len(prefix) :].split("/")) if keys else None

    def is_file(self, path: Path) -> bool:
        return self._call("head_object", Key="/".join(path)) is not None

    def walk(self, folder: Path) -> Iterator[Path]:
        prefix, token = "/".join(folder) + "/", None
        while True:
            more: dict[str, str] = {"ContinuationToken": token} if token else {}
            answer = self._call("list_objects_v2", Prefix=prefix, MaxKeys=PAGE_KEYS, **more) or {}
            for listed in answer.get("Contents", []):
                yield tuple(listed["Key"][len(prefix) :].split("/"))
            token = answer.get("NextContinuationToken")
            if not answer.get("IsTruncated") or not token:
                return

    def read(self, path: Path, limit: int) -> bytes | None:
        answer = self._call("get_object", Key="/".join(path), Range=f"bytes=0-{limit - 1}")
        return None if answer is None else bytes(answer["Body"].read(limit))


class ArrowStore:
    """A local folder (walked lazily) or a GCS bucket, through :func:`airflow_tune.common.storage.resolve`."""

    registries = False

    def __init__(self, folder: StorageLocation) -> None:
        from airflow_tune.common import storage

        self.local = folder.scheme == "file"
        self.bucket = folder.bucket
        self.fs, _ = storage.resolve(folder.uri)

    def _path(self, segments: Path) -> str:
        return "/" + "/".join(segments) if self.local else "/".join((self.bucket, *segments))

    def first_below(self, folder: Path) -> Path | None:
        return next(iter(self.walk(folder)), None)

    def is_file(self, path: Path) -> bool:
        import pyarrow.fs

        return bool(self.fs.get_file_info(self._path(path)).type == pyarrow.fs.FileType.File)

    def walk(self, folder: Path) -> Iterator[Path]:
        import pyarrow.fs

        top = self._path(folder)
        if self.local:
            for where, folders, files in os.walk(top):
                folders.sort()
                below = os.path.relpath(where, top)
                base = () if below == "." else tuple(below.split(os.sep))
                yield from ((*base, name) for name in sorted(files))
            return
        selector = pyarrow.fs.FileSelector(top, recursive=True, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pyarrow.fs.FileType.File:
                yield tuple(info.path[len(top) + 1 :].split("/"))

    def read(self, path: Path, limit: int) -> bytes | None:
        try:
            with self.fs.open_input_stream(self._path(path)) as stream:
                return bytes(stream.read(limit))
        except FileNotFoundError:
            return None
