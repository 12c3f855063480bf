"""Airflow's own record of a promotion: what the deploy helpers verify a registry version's files against.

A registry (the S3 prefix, MLflow's tags, the version folders) is written by whoever holds its credentials, so a digest
kept beside the files proves nothing to a reader: its writer recomputes it. The promote task therefore records what it
registered where only Airflow writes:

- its XCom (the return value): ``registered_files``, ``{path relative to the version's folder: "sha256:<hex>"}`` of
  every file it wrote (the checkpoint's copy under ``checkpoint/``, digests of the bytes it read and proved; the MLflow
  Model's own files, digests of the bytes it wrote), ``files_digest`` (one digest over that map, as
  :func:`~airflow_tune.common.provenance.files_digest`), and the task instance that wrote it;
- the registry's Asset event: ``files_digest``, the file count, the version, its folder and the registry (the extra
  stays small). Airflow fills in the event's source task instance; one created through the REST API has none.

The registry also keeps the map (``registered.json`` in the version's folder), so a reader given only the Asset event
can name the file that differs; it is believed only when its digest is the record's ``files_digest``.

A record counts when a promote task of one of the registry's DAGs (:func:`~airflow_tune.registries.owner.dags_of`)
made it: an Asset event without a source task (the REST API's) is refused, and so is one from another DAG. Inside an
Airflow task a helper given no record finds it itself (:func:`from_airflow`): the version names the promote task
instance that registered it, whose XCom it pulls through the Task SDK.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from airflow_tune.common.provenance import differences, files_digest
from airflow_tune.exceptions import PromotionError

log = logging.getLogger(__name__)

#: The XCom keys of the record.
FILES_KEY, DIGEST_KEY, PROMOTED_BY_KEY = "registered_files", "files_digest", "promoted_by"
#: The map's copy in the version's folder (believed only through the record's digest); not one of the model's files.
RECORD_FILE = "registered.json"
#: What identifies the promote task instance.
TI_FIELDS = ("dag_id", "run_id", "task_id", "map_index")


@dataclass(frozen=True)
class Promotion:
    """A promotion as Airflow recorded it.

    :param registry: the registry URI the promotion wrote (``s3://...`` or ``models:/<name>``).
    :param version: the version it registered (MLflow's number, or the S3 registry's version name).
    :param folder: the version's folder URI (``registered_files`` are relative to it).
    :param digest: ``files_digest``.
    :param files: the map itself, when the record carries it (the XCom does; an Asset event does not).
    :param promoted_by: the promote task instance (``dag_id``, ``run_id``, ``task_id``, ``map_index``).
    :param what: the record, for messages.
    """

    registry: str
    version: str
    folder: str
    digest: str
    files: dict[str, str] | None
    promoted_by: dict[str, Any] = field(default_factory=dict)
    what: str = "the promotion"


def registered_files(checkpoint: Mapping[str, str], model: Mapping[str, str] | None = None) -> dict[str, str]:
    """The map of a version's folder: the checkpoint's files under ``checkpoint/``, the model's own beside them."""
    from airflow_tune.registries.mlflow_model import CHECKPOINT_ARTIFACT

    files = dict(model or {})
    files.update({f"{CHECKPOINT_ARTIFACT}/{rel}": digest for rel, digest in checkpoint.items()})
    return files


def promoted_by(context: Any) -> dict[str, Any]:
    """The promote task instance of ``context``: what a reader pulls the XCom of."""
    ti = context["ti"]
    index = getattr(ti, "map_index", -1)
    return {
        "dag_id": str(ti.dag_id),
        "run_id": str(context["run_id"]),
        "task_id": str(ti.task_id),
        "map_index": int(index) if isinstance(index, int) else -1,
    }


def xcom_fields(files: Mapping[str, str], context: Any) -> dict[str, Any]:
    """What the promote task's XCom gains when it promoted."""
    files = dict(sorted(files.items()))
    return {FILES_KEY: files, DIGEST_KEY: files_digest(files), PROMOTED_BY_KEY: promoted_by(context)}


def event_extra(registry: str, version: str, folder: str, files: Mapping[str, str]) -> dict[str, Any]:
    """What the registry's Asset event gains (not the whole map: an event's extra stays small)."""
    return {
        "registry": registry.rstrip("/"),
        "version_folder": folder,
        DIGEST_KEY: files_digest(files),
        "file_count": len(files),
    }


def stored_body(files: Mapping[str, str], context: Any) -> bytes:
    """``registered.json``: the map and who wrote it (for a reader holding only the record's digest)."""
    return json.dumps(xcom_fields(files, context), indent=1).encode()


# -- reading a record -------------------------------------------------------------------------------------------
def registry_of(promotion: Any) -> str:
    """The registry a record says it is of (the event's asset, the XCom's ``registry``); checked by :func:`of`."""
    if _is_event(promotion):
        return str(getattr(getattr(promotion, "asset", None), "uri", "") or "").rstrip("/")
    if isinstance(promotion, Mapping) and isinstance(promotion.get("registry"), str):
        return str(promotion["registry"]).rstrip("/")
    raise _not_a_record(promotion)


def _not_a_record(promotion: Any) -> TypeError:
    return TypeError(
        f"promotion = {type(promotion).__name__}: give the promote task's XCom (promote.output passed into a @task) "
        'or an Asset event of the registry (context["triggering_asset_events"][asset][-1])'
    )


def _is_event(value: Any) -> bool:
    return hasattr(value, "source_task_id") and hasattr(value, "extra")


def of(promotion: Any, registry: str, dags: Collection[str]) -> Promotion:
    """The record ``promotion`` is (the promote task's XCom dict, or an Asset event of the registry), checked to be a
    promotion a promote task of one of ``registry``'s DAGs (``dags``: :func:`~airflow_tune.registries.owner.dags_of`)
    made.

    :raises PromotionError: an Asset event without a source task (made through the REST API), from another DAG or of
        another registry; an XCom of a decision that did not promote.
    :raises TypeError: neither an XCom dict nor an Asset event.
    """
    registry = registry.rstrip("/")
    if _is_event(promotion):
        return _of_event(promotion, registry, dags)
    if isinstance(promotion, Mapping):
        return _of_xcom(promotion, registry, dags)
    raise _not_a_record(promotion)


def _of_event(event: Any, registry: str, dags: Collection[str]) -> Promotion:
    asset = getattr(event, "asset", None)
    uri = str(getattr(asset, "uri", "") or "").rstrip("/")
    what = f"the Asset event of {uri or 'an unknown asset'} at {getattr(event, 'timestamp', '?')}"
    if not event.source_task_id or not event.source_dag_id or not event.source_run_id:
        raise PromotionError(
            f"{what} was not made by a promote task (it has no source task instance: it was created through the "
            "REST API or by hand): it is not a promotion; refusing to load from it"
        )
    if uri and uri != registry:
        raise PromotionError(f"{what} is an event of another asset than the registry {registry}: refusing it")
    extra = dict(event.extra or {})
    by: dict[str, Any] = {
        "dag_id": str(event.source_dag_id),
        "run_id": str(event.source_run_id),
        "task_id": str(event.source_task_id),
        "map_index": event.source_map_index if event.source_map_index is not None else -1,
    }
    what = f"{what} (made by task {by['task_id']!r} of DAG {by['dag_id']!r}, run {by['run_id']!r})"
    _check_dag(registry, dags, by["dag_id"], what)
    found = _fields(extra, registry, None, by, what)
    # Inside a task, the map itself from the event's own source task instance: then the helper names the file that
    # differs even when a registry writer rewrote the folder's copy of the map.
    xcom = _pull(by)
    files = xcom.get(FILES_KEY) if isinstance(xcom, Mapping) else None
    if isinstance(files, Mapping) and files:
        if files_digest(files) != found.digest:
            raise PromotionError(
                f"{what}: its files_digest is not the digest of the registered_files its promote task's XCom holds: "
                "refusing it"
            )
        found = Promotion(found.registry, found.version, found.folder, found.digest, dict(files), by, what)
    return found


def _of_xcom(xcom: Mapping[str, Any], registry: str, dags: Collection[str]) -> Promotion:
    by = xcom.get(PROMOTED_BY_KEY)
    if not xcom.get("promoted"):
        reason = str(xcom.get("reason"))[:300]
        raise PromotionError(f"the promote task's XCom says it did not promote ({reason!r}): nothing to load")
    if not isinstance(by, Mapping) or not all(by.get(k) not in (None, "") for k in ("dag_id", "run_id", "task_id")):
        raise PromotionError(
            "the promote task's XCom names no promote task instance (promoted_by): it was not written by this "
            "version of PromoteCheckpointOperator; promote again"
        )
    what = f"the XCom of task {by['task_id']!r} of DAG {by['dag_id']!r}, run {by['run_id']!r}"
    _check_dag(registry, dags, str(by["dag_id"]), what)
    files = xcom.get(FILES_KEY)
    if not isinstance(files, Mapping) or not files or files_digest(files) != xcom.get(DIGEST_KEY):
        raise PromotionError(f"{what} holds no registered_files whose digest is its files_digest: refusing it")
    return _fields(xcom, registry, dict(files), dict(by), what)


def _fields(
    values: Mapping[str, Any], registry: str, files: dict[str, str] | None, by: dict[str, Any], what: str
) -> Promotion:
    recorded = str(values.get("registry") or registry).rstrip("/")
    version, folder, digest = values.get("version"), values.get("version_folder"), values.get(DIGEST_KEY)
    if recorded != registry:
        raise PromotionError(f"{what} is a promotion into {recorded}, not into {registry}: refusing it")
    if not all(isinstance(v, str) and v for v in (version, folder, digest)):
        raise PromotionError(
            f"{what} names no version, version folder or files_digest: it was not made by this version of "
            "PromoteCheckpointOperator; promote again"
        )
    return Promotion(registry, str(version), str(folder).rstrip("/"), str(digest), files, by, what)


def _check_dag(registry: str, dags: Collection[str], dag_id: str, what: str) -> None:
    if dag_id not in dags:
        names = ", ".join(repr(d) for d in sorted(dags)) or "none"
        raise PromotionError(
            f"{what}: DAG {dag_id!r} is not one of the registry {registry}'s DAGs ({names}): not a promotion into it; "
            "refusing to load from it"
        )


# -- finding the record inside an Airflow task --------------------------------------------------------------------
def current_context() -> Any:
    """The running Airflow task's context, or None outside one."""
    try:
        from airflow.sdk import get_current_context

        return get_current_context()
    except Exception:  # no task runs here (a script, a notebook, a test): Airflow raises its own error
        return None


def from_airflow(registry: str, by: Mapping[str, Any] | None, where: str, dags: Collection[str]) -> Promotion | None:
    """Inside an Airflow task: the XCom of the promote task instance ``by`` (what the version's registry record
    names), pulled through the Task SDK and checked (:func:`of`). None outside a task.

    :raises PromotionError: inside a task, the version names no promote task instance, or Airflow holds no XCom of
        it (a registry writer's version, or one made outside Airflow).
    """
    context = current_context()
    if context is None:
        return None
    if not isinstance(by, Mapping) or not all(isinstance(by.get(k), str) and by.get(k) for k in TI_FIELDS[:3]):
        raise PromotionError(
            f"{where} names no promote task instance, so Airflow holds no record of its promotion: refusing to load "
            "it (promote it again, or pass promotion= the promote task's XCom or the triggering Asset event)"
        )
    xcom = _pull(by, context)
    if not isinstance(xcom, Mapping):
        raise PromotionError(
            f"{where} names the promote task {by['task_id']!r} of DAG {by['dag_id']!r}, run {by['run_id']!r}, but "
            "Airflow holds no XCom of it: it is not a promotion Airflow recorded; refusing to load it"
        )
    return of(xcom, registry, dags)


def _pull(by: Mapping[str, Any], context: Any = None) -> Any:
    """The return value of the task instance ``by`` through the running task's Task SDK; None outside a task."""
    context = context if context is not None else current_context()
    if context is None:
        return None
    index = by.get("map_index", -1)
    index = index if isinstance(index, int) and not isinstance(index, bool) else -1
    return context["ti"].xcom_pull(
        task_ids=str(by["task_id"]), dag_id=str(by["dag_id"]), run_id=str(by["run_id"]), map_indexes=index
    )


def fallback_warning(where: str) -> None:
    """Outside Airflow without a record: what is verified instead, said in the log."""
    log.warning(
        "%s: no Airflow record of its promotion was given (promotion=) and this is not an Airflow task, so its "
        "files are verified against the digests the registry stores beside them, which a writer of the registry "
        "can recompute. Pass promotion= (the promote task's XCom or its Asset event) to verify against Airflow's "
        "record.",
        where,
    )


# -- the files ----------------------------------------------------------------------------------------------------
def expected_files(record: Promotion, stored: bytes | None) -> dict[str, str]:
    """The record's map: its own, or the version folder's ``registered.json`` when its digest is the record's."""
    if record.files is not None:
        return record.files
    try:
        parsed = json.loads(stored) if stored is not None else None
    except ValueError:
        parsed = None
    files = parsed.get(FILES_KEY) if isinstance(parsed, dict) else None
    if not isinstance(files, dict) or files_digest(files) != record.digest:
        raise PromotionError(
            f"{record.what}: the version folder's {RECORD_FILE} is missing or is not the map of files its promotion "
            f"registered (its digest is not {record.digest}): the registry was changed; refusing to load it (give "
            "promotion= the promote task's XCom, or run inside an Airflow task, to name the file that differs)"
        )
    return {str(k): str(v) for k, v in files.items()}


def verify(expected: Mapping[str, str], found: Mapping[str, str], what: str, where: str) -> None:
    """Refuse (naming the files) unless ``found`` are exactly the ``expected`` files, byte for byte."""
    if dict(expected) != dict(found):
        raise PromotionError(
            f"{what}: the files read from {where} are not the ones its promotion registered as Airflow recorded it "
            f"({differences(expected, found)}): storage or the registry was changed; refusing to hand them over"
        )


def part(files: Mapping[str, str], below: str) -> dict[str, str]:
    """The entries of ``files`` below the folder ``below`` (relative to it); all of them for ``""``."""
    if not below:
        return dict(files)
    prefix = below.rstrip("/") + "/"
    return {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}


# -- the promote task's side ----------------------------------------------------------------------------------------
#: Files of a version's folder that are not the model's: the S3 registry's card and the map's copy.
NOT_REGISTERED = ("model.json", RECORD_FILE)


def write_stored(s3: Any, folder: str, files: Mapping[str, str], context: Any) -> None:
    """Put ``registered.json`` into the version's folder (``s3://bucket/prefix``)."""
    from airflow_tune.registries.s3 import split_s3_uri

    bucket, prefix = split_s3_uri(folder)
    s3.put_object(
        Bucket=bucket, Key=f"{prefix}/{RECORD_FILE}", Body=stored_body(files, context), ContentType="application/json"
    )


def hash_folder(s3: Any, folder: str) -> dict[str, str]:
    """``{relative path: "sha256:<hex>"}`` of the objects under the version's folder, from the bytes read now (a
    retry's record of a version an earlier try wrote)."""
    from airflow_tune.common.provenance import CHUNK, digest_stream
    from airflow_tune.registries.s3 import list_checkpoint, split_s3_uri

    bucket, _ = split_s3_uri(folder)
    out = {}
    for obj in list_checkpoint(s3, folder):
        if obj["rel"] in NOT_REGISTERED:
            continue
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"]
        out[str(obj["rel"])] = digest_stream(iter(partial(body.read, CHUNK), b""))
    return out
