"""The model registry in MLflow: ``registry_uri="models:/<name>"``.

A promotion copies the winner's checkpoint (every file's bytes proven on the way) into a folder of the version's own,
``s3://<bucket>/mlflow-models/<name>/versions/<version name>/`` (:func:`version_folder_uri`; with ``model_loader``
the MLflow Model's files beside it), registers that folder as a version of the registered model ``<name>``, tagged
with what it is (``airflow_tune.*``: the metric and its value, the config as JSON, the experiment, the Airflow run,
the deterministic version name and the content digest of the checkpoint's files), and moves the alias ``champion``
to it last. Deploy tasks load ``models:/<name>@champion`` (or
``models:/<name>/<version>``) through :mod:`airflow_tune.checkpoints`, which believes a version only as far as the
Ray job of the experiment it names vouches for it, and verifies the bytes it downloads against the digest: neither
the registry nor the storage is trusted.

Every registry call goes through :class:`MLflowRegistry`, which turns the client's failures into
:class:`~airflow_tune.exceptions.MLflowError` naming the call and the cause. ``mlflow`` is imported only inside
functions (DAG files import the operators).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from airflow_tune.common import jsonsafe
from airflow_tune.common.contract import MODELS_PREFIX, is_mlflow_uri
from airflow_tune.exceptions import MLflowError, PromotionError

if TYPE_CHECKING:
    from airflow_tune.hooks.mlflow import MLflowHook
    from airflow_tune.registries.record import Promotion

CHAMPION_ALIAS = "champion"
TAG = "airflow_tune."
VERSION_TAG = TAG + "version"
#: What a version is (``pyfunc``: an MLflow Model built around the checkpoint; ``checkpoint``: the checkpoint is one;
#: absent: a bare checkpoint), the MLflow Model's folder and the digest of all its files.
MODEL_TAG, MODEL_URI_TAG, MODEL_DIGEST_TAG = TAG + "model", TAG + "model_uri", TAG + "model_digest"
READY_TIMEOUT_S = 300.0
# Version names go into a search filter between quotes: only characters that cannot end or escape the string.
_FILTER_SAFE = re.compile(r"^[A-Za-z0-9_.:+-]+$")
_NAME_REFUSED = re.compile(r"[@/\s'\"`]")

T = TypeVar("T")


def registered_model_name(registry_uri: str) -> str:
    """``models:/<name>`` -> ``<name>``; refuses a version, an alias or an empty name (ValueError)."""
    name = registry_uri[len(MODELS_PREFIX) :] if is_mlflow_uri(registry_uri) else ""
    if not name or _NAME_REFUSED.search(name):
        raise ValueError(
            f"registry_uri = {registry_uri!r}: an MLflow registry is models:/<name>, a registered model's name "
            "without '/', '@', quotes or spaces (the promotion chooses the version and moves the alias)"
        )
    return name


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/<name>@<alias>`` -> ``(name, alias, None)``; ``models:/<name>/<version>`` -> ``(name, None,
    version)``; ``models:/<name>`` -> ``(name, "champion", None)``. ValueError for anything else."""
    rest = uri[len(MODELS_PREFIX) :] if is_mlflow_uri(uri) else ""
    name, alias, version = rest, None, None
    if "@" in rest:
        name, _, alias = rest.partition("@")
    elif "/" in rest:
        name, _, version = rest.partition("/")
    else:
        alias = CHAMPION_ALIAS
    if not name or _NAME_REFUSED.search(name) or (alias is not None and not _FILTER_SAFE.match(alias)):
        raise ValueError(f"{uri!r}: give models:/<name>@<alias> or models:/<name>/<version>")
    if version is not None and not version.isdigit():
        raise ValueError(f"{uri!r}: a model version is a number, e.g. models:/{name}/3")
    return name, alias, version


def tags_of(version: Any) -> dict[str, str]:
    return dict(getattr(version, "tags", None) or {})


def tagged_value(tags: dict[str, str]) -> float | None:
    """The ``airflow_tune.value`` tag as a finite number, or None."""
    try:
        value = json.loads(tags[TAG + "value"])
    except (KeyError, ValueError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def describe(version: Any) -> dict[str, Any]:
    """A JSON-safe summary of a model version (for the XCom result)."""
    tags = tags_of(version)
    return {
        "version": str(version.version),
        "model_uri": f"{MODELS_PREFIX}{version.name}/{version.version}",
        "uri": version.source,
        "airflow_tune_version": tags.get(VERSION_TAG),
        "metric": tags.get(TAG + "metric"),
        "mode": tags.get(TAG + "mode"),
        "value": tagged_value(tags),
    }


class MLflowRegistry:
    """One registered model, through an ``MlflowClient``; every failure becomes an MLflowError naming the call.

    :param client: an ``MlflowClient`` (from :meth:`~airflow_tune.hooks.mlflow.MLflowHook.client`).
    :param name: the registered model's name.
    :param server: the tracking server's URI, for messages.
    """

    def __init__(self, client: Any, name: str, server: str) -> None:
        self.client = client
        self.name = name
        self.server = server

    def call(self, what: str, fn: Callable[..., T], *args: Any, missing_ok: bool = False, **kwargs: Any) -> T | None:
        """``fn(*args, **kwargs)``; None when it answers 'does not exist' and ``missing_ok``; else MLflowError."""
        try:
            return fn(*args, **kwargs)
        except MLflowError:
            raise
        except Exception as exc:
            if missing_ok and getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                return None
            cause = f"{type(exc).__name__}: {str(exc)[:400]}"
            raise MLflowError(
                f"the MLflow registry {self.server} failed to {what} of model {self.name!r}: {cause}"
            ) from exc

    def version_by_alias(self, alias: str) -> Any:
        """The version under ``alias``, or None (no such model, or no such alias on it).

        Read from the registered model's aliases: the server answers a missing alias with INVALID_PARAMETER_VALUE,
        not RESOURCE_DOES_NOT_EXIST, which cannot be told from a real error without reading its message."""
        model = self.call("read the registered model", self.client.get_registered_model, self.name, missing_ok=True)
        number = (getattr(model, "aliases", None) or {}).get(alias) if model is not None else None
        return None if number is None else self.get_version(str(number))

    def get_version(self, version: str) -> Any:
        return self.call(f"read version {version}", self.client.get_model_version, self.name, version, missing_ok=True)

    def find_version(self, version_name: str) -> Any:
        """The version tagged ``airflow_tune.version = version_name`` (an earlier try's), or None."""
        if not _FILTER_SAFE.match(version_name):
            raise PromotionError(f"version name {version_name!r} has characters a registry search cannot hold")
        found = self.call(
            "search versions",
            self.client.search_model_versions,
            f"tags.`{VERSION_TAG}` = '{version_name}'",
            missing_ok=True,
        )
        mine = sorted((v for v in found or [] if v.name == self.name), key=lambda v: int(v.version))
        return mine[0] if mine else None

    def create_version(self, source: str, run_id: str | None, tags: dict[str, str]) -> Any:
        return self.call(
            "create a version",
            self.client.create_model_version,
            self.name,
            source,
            run_id=run_id,
            tags=tags,
            await_creation_for=0,  # waited for by wait_ready, for a created and a found version alike
        )

    def wait_ready(self, version: Any, timeout: float = READY_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while version.status == "PENDING_REGISTRATION":
            if time.monotonic() > deadline:
                raise MLflowError(f"version {version.version} of model {self.name!r} is not READY after {timeout}s")
            time.sleep(1.0)
            version = self.get_version(str(version.version)) or version
        if version.status != "READY":
            raise MLflowError(
                f"version {version.version} of model {self.name!r} is {version.status}: {version.status_message}"
            )
        return version

    def set_alias(self, alias: str, version: str) -> None:
        self.call(
            f"move the alias {alias!r} to version {version}",
            self.client.set_registered_model_alias,
            self.name,
            alias,
            version,
        )


@contextmanager
def opened(hook: MLflowHook, name: str) -> Iterator[MLflowRegistry]:
    """The registry of model ``name`` on the hook's server, after a preflight (a server that does not answer fails
    here, fast, naming it)."""
    hook.preflight()
    with hook.client() as client:
        yield MLflowRegistry(client, name, hook.tracking_uri)


def version_tags(
    result: dict[str, Any], context: Any, version_name: str, digest: str, checkpoint_uri: str
) -> dict[str, str]:
    """The tags a promoted version carries: what it is, where it came from, and how to check it is unchanged."""
    ti = context["ti"]
    metric = result["metric"]
    value = (result.get("best_metrics") or {}).get(metric)
    return {
        VERSION_TAG: version_name,
        TAG + "metric": str(metric),
        TAG + "mode": str(result["mode"]),
        TAG + "value": jsonsafe.dumps(value),
        TAG + "config": jsonsafe.dumps(result.get("best_config")),
        TAG + "experiment": str(result.get("experiment") or ""),
        TAG + "experiment_uri": str(result.get("experiment_uri") or ""),
        TAG + "trial_id": str(result.get("best_trial_id") or ""),
        TAG + "checkpoint_uri": checkpoint_uri,
        TAG + "checkpoint_digest": digest,
        TAG + "dag_id": str(ti.dag_id),
        TAG + "task_id": str(ti.task_id),
        TAG + "run_id": str(context["run_id"]),
        TAG + "map_index": str(getattr(ti, "map_index", -1)),
    }


def champion_config(hook: MLflowHook, uri: str) -> dict[str, Any] | None:
    """The config (the ``airflow_tune.config`` tag, JSON: data only) of the version ``uri`` names; None when the
    model or the alias does not exist or the version carries no config of ours."""
    name, alias, number = parse_model_uri(uri)
    with opened(hook, name) as registry:
        version = registry.version_by_alias(alias) if alias else registry.get_version(str(number))
    if version is None:
        return None
    raw = tags_of(version).get(TAG + "config")
    if raw is None:
        return None
    config = json.loads(raw)
    if not isinstance(config, dict):
        raise MLflowError(f"{uri}: version {version.version}'s {TAG}config tag is not a JSON object")
    return config


#: Where a ``models:/`` registry's versions keep their files, in the bucket of the checkpoint they were promoted from:
#: ``s3://<bucket>/mlflow-models/<registered model>/versions/<version name>/``. Outside every experiment's folder (the
#: Ray nodes write those); written by the promote task only. A deployment lets only Airflow's credentials write it.
VERSIONS_ROOT = "mlflow-models"


def version_folder_uri(checkpoint_uri: str, name: str, version_name: str) -> str:
    """The folder a ``models:/<name>`` promotion writes a version's files to (its checkpoint's copy under
    ``checkpoint/``, and an MLflow Model's own files): one per registered model and version, so two registries
    promoting the same experiment never share one."""
    from airflow_tune.registries.s3 import split_s3_uri

    bucket, _ = split_s3_uri(checkpoint_uri)
    if name in (".", "..") or version_name in ("", ".", "..") or "/" in version_name:
        raise PromotionError(f"model {name!r}, version {version_name!r}: not a name a folder can have")
    return f"s3://{bucket}/{VERSIONS_ROOT}/{name}/versions/{version_name}"


class ProvenVersion:
    """A registry version proven by its experiment: what to download and which digests its files must have.

    :param checkpoint_uri: where the checkpoint's files are read from (inside the MLflow Model for ``pyfunc``).
    :param checkpoint_digest: their content digest, as the experiment's sealed result records it.
    :param model_kind: ``pyfunc``, ``checkpoint`` or None (a bare checkpoint).
    :param model_uri: the MLflow Model's folder (the version's source), or None.
    :param model_digest: the digest of all its files, as the promotion recorded it.
    :param what: the version, for messages.
    """

    def __init__(
        self,
        checkpoint_uri: str,
        checkpoint_digest: str,
        model_kind: str | None,
        model_uri: str | None,
        model_digest: str | None,
        what: str,
        folder: str = "",
    ) -> None:
        self.checkpoint_uri, self.checkpoint_digest = checkpoint_uri, checkpoint_digest
        self.model_kind, self.model_uri, self.model_digest, self.what = model_kind, model_uri, model_digest, what
        #: The version's folder, and Airflow's record of its promotion (None outside Airflow without one).
        self.folder = folder
        self.record: Promotion | None = None


def proven_version(registry: MLflowRegistry, version: Any, ray_conn_id: str, what: str) -> ProvenVersion:
    """A version's checkpoint and MLflow Model, when the version's experiment proves the checkpoint: tags are
    written by whoever may write the registry, so the checkpoint is believed only as far as the Ray job of the
    experiment they name vouches for it (:func:`airflow_tune.registries.s3.prove_checkpoint`); its files must lie in
    the folder a promotion into this registered model writes (:func:`version_folder_uri`), and an MLflow Model's
    other files are believed by the digest the registry records (registry write access is what guards the
    loader's code)."""
    from airflow_tune.registries.mlflow_model import CHECKPOINT_ARTIFACT
    from airflow_tune.registries.owner import dags_of, read_mlflow_record
    from airflow_tune.registries.s3 import prove_checkpoint

    tags = tags_of(version)
    where = f"version {version.version} of model {registry.name!r}"
    source, digest = version.source, tags.get(TAG + "checkpoint_digest")
    checkpoint, kind = tags.get(TAG + "checkpoint_uri"), tags.get(MODEL_TAG) or None
    experiment_uri, version_name = tags.get(TAG + "experiment_uri"), tags.get(VERSION_TAG)
    if not checkpoint or not digest or not experiment_uri or not version_name:
        raise PromotionError(
            f"{where} was not registered by airflow-tune (it has no {TAG}checkpoint_uri, checkpoint digest, "
            "experiment or version tag): refusing to load it"
        )
    folder = version_folder_uri(checkpoint, registry.name, version_name)
    copy = f"{folder}/{CHECKPOINT_ARTIFACT}"
    expected = folder if kind == "pyfunc" else copy
    if (
        kind not in (None, "checkpoint", "pyfunc")
        or source != expected
        or (kind is not None and (tags.get(MODEL_URI_TAG) != source or not tags.get(MODEL_DIGEST_TAG)))
    ):
        raise PromotionError(
            f"{where}: its source {str(source)[:300]!r} is not the folder a promotion into this registered model "
            f"writes ({expected}), or it has no model digest: refusing to load it"
        )
    dags = dags_of(f"models:/{registry.name}", read_mlflow_record(registry)[1])
    prove_checkpoint(
        where,
        experiment_uri,
        checkpoint,
        digest,
        ray_conn_id=ray_conn_id,
        dag_id=tags.get(TAG + "dag_id"),
        dags=dags,
    )
    if kind == "pyfunc":
        return ProvenVersion(copy, str(digest), kind, str(source), tags[MODEL_DIGEST_TAG], what, folder)
    model_uri = str(source) if kind == "checkpoint" else None
    return ProvenVersion(copy, str(digest), kind, model_uri, str(digest) if model_uri else None, what, folder)


def verified_source(registry: MLflowRegistry, version: Any, ray_conn_id: str) -> tuple[str, str]:
    """The checkpoint a version names (where its files are read) and the content digest they must have, proven by
    the version's experiment (:func:`proven_version`)."""
    proven = proven_version(registry, version, ray_conn_id, "")
    return proven.checkpoint_uri, proven.checkpoint_digest


def resolve_version(
    uri: str, mlflow_conn_id: str, ray_conn_id: str = "ray_default", promotion: Any = None
) -> ProvenVersion:
    """The version ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` names (with ``promotion``: the version
    that promotion registered), proven (see :func:`proven_version`), with Airflow's record of its promotion
    (:mod:`~airflow_tune.registries.record`): ``promotion`` checked, or inside an Airflow task the XCom of the
    promote task instance the version names. The caller verifies the bytes it reads against both."""
    from airflow_tune.hooks.mlflow import MLflowHook
    from airflow_tune.registries import record
    from airflow_tune.registries.owner import dags_of, read_mlflow_record

    name, alias, number = parse_model_uri(uri)
    registry_uri = f"{MODELS_PREFIX}{name}"
    with opened(MLflowHook(mlflow_conn_id), name) as registry:
        dags = dags_of(registry_uri, read_mlflow_record(registry)[1])
        given = record.of(promotion, registry_uri, dags) if promotion is not None else None
        if given is not None:
            if number is not None and number != given.version:
                raise ValueError(
                    f"uri = {uri!r} names version {number}, but promotion= is {given.what}, which registered "
                    f"version {given.version}: give models:/{name} (or that version) with it"
                )
            version = registry.get_version(given.version)
        else:
            version = registry.version_by_alias(alias) if alias else registry.get_version(str(number))
        if version is None:
            raise MLflowError(f"{uri}: no such model version in the MLflow registry {registry.server}")
        what = f"{uri} (version {version.version} of model {name!r})"
        proven = proven_version(registry, version, ray_conn_id, what)
    found = given
    if found is None:
        tags = tags_of(version)
        index = tags.get(TAG + "map_index", "-1")
        by = {
            "dag_id": tags.get(TAG + "dag_id"),
            "run_id": tags.get(TAG + "run_id"),
            "task_id": tags.get(TAG + "task_id"),
            "map_index": int(index) if index.lstrip("-").isdigit() else -1,
        }
        found = record.from_airflow(registry_uri, by, what, dags)
        if found is None:
            record.fallback_warning(what)
    if found is not None and (found.version != str(version.version) or found.folder != proven.folder):
        raise PromotionError(
            f"{what}: Airflow's record of its promotion ({found.what}) names version {found.version} in "
            f"{found.folder}, not this version's folder {proven.folder}: refusing to load it"
        )
    proven.record = found
    return proven
