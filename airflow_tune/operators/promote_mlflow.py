"""PromoteCheckpointOperator's MLflow path (``registry_uri="models:/<name>"``), a mixin of the operator.

Order, each step safe to repeat: the registry's preflight; the checkpoint listed on S3 (its deterministic version
name and its digest); the champion (alias ``champion``) and a version an earlier try registered (found by its
``airflow_tune.version`` tag); the gate; only when it passes, the checkpoint copied into the version's own folder,
every file's bytes proven on the way (a changed one fails the task here, before any version or tag is written), the
version registered (its source that folder) and waited for until READY; the alias moved last; the Asset event. A try
that fails anywhere leaves the alias where it was, and the next try reuses the version the failed one created. A
retry after the alias moved finds its version already the champion and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_tune.exceptions import PromotionError
from airflow_tune.registries import owner as registry_owner
from airflow_tune.registries.s3 import list_checkpoint
from airflow_tune.registries.s3 import version_name as version_of

#: The version tag of the checkpoint's content digest.
TAG_DIGEST = "airflow_tune.checkpoint_digest"

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_tune.hooks.mlflow import MLflowHook
    from airflow_tune.registries.mlflow import MLflowRegistry


class MLflowPromotion:
    """The MLflow registry path of :class:`~airflow_tune.operators.promote.PromoteCheckpointOperator`."""

    # The operator's attributes and methods this path uses.
    registry_uri: str
    gate: str
    dag_id: str
    mlflow_conn_id: str
    outlets: Any
    log: Any
    returned: dict[str, Any] | None

    if TYPE_CHECKING:

        def s3_client(self) -> Any: ...

        def registry_claim(self) -> registry_owner.Claim: ...

        def not_promoted(self, context: Context, out: dict[str, Any]) -> dict[str, Any]: ...

        def model_kind(self, result: dict[str, Any], registry: str) -> str | None: ...

        def write_model(
            self, s3: Any, result: dict[str, Any], bucket: str, prefix: str, version: str
        ) -> tuple[str, str, dict[str, str]]: ...

    def mlflow_hook(self) -> MLflowHook:
        from airflow_tune.hooks.mlflow import MLflowHook

        return MLflowHook(self.mlflow_conn_id)

    def mlflow_registry(self, client: Any, name: str, server: str) -> MLflowRegistry:
        """The registry every call of a promotion goes through."""
        from airflow_tune.registries.mlflow import MLflowRegistry

        return MLflowRegistry(client, name, server)

    def execute_mlflow(self, context: Context, result: dict[str, Any], threshold: float | None) -> dict[str, Any]:
        from airflow.sdk import Asset

        from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY
        from airflow_tune.registries import record
        from airflow_tune.registries.gates import decision_record, gate_decision
        from airflow_tune.registries.mlflow import (
            CHAMPION_ALIAS,
            MODEL_DIGEST_TAG,
            MODEL_TAG,
            MODEL_URI_TAG,
            MODELS_PREFIX,
            TAG,
            describe,
            registered_model_name,
            tagged_value,
            tags_of,
            version_folder_uri,
            version_tags,
        )
        from airflow_tune.registries.mlflow_model import CHECKPOINT_ARTIFACT
        from airflow_tune.registries.s3 import check_listing

        name = registered_model_name(self.registry_uri)
        metric, mode = result["metric"], result["mode"]
        value = (result.get("best_metrics") or {}).get(metric)
        source = result.get("best_checkpoint_uri")
        hook = self.mlflow_hook()
        hook.preflight()
        version_name = digest = None
        objects: list[dict[str, Any]] = []
        if source:
            # Listed before the gate: the version is named from the checkpoint itself, so a retry finds it again.
            objects = list_checkpoint(self.s3_client(), str(source))
            if not objects:
                raise PromotionError(f"no objects found under the checkpoint {source}")
            check_listing(result, objects)
            version_name, digest = version_of(result, objects), result.get(CHECKPOINT_DIGEST_KEY)

        with hook.client() as client:
            registry = self.mlflow_registry(client, name, hook.tracking_uri)
            claim = self.registry_claim()
            registry_owner.check_mlflow(registry, claim)
            champion = registry.version_by_alias(CHAMPION_ALIAS)
            existing = registry.find_version(version_name) if version_name else None
            if existing is not None and tags_of(existing).get(TAG + "checkpoint_uri") != source:
                raise PromotionError(
                    f"version {existing.version} of model {name!r} carries this promotion's name {version_name} but "
                    f"another checkpoint ({tags_of(existing).get(TAG + 'checkpoint_uri')}): refusing to reuse it"
                )
            if existing is not None and tags_of(existing).get(TAG + "checkpoint_digest") != digest:
                raise PromotionError(
                    f"the checkpoint {source} changed since an earlier try registered it as version "
                    f"{existing.version} of model {name!r}: its content digest is not that version's"
                )
            already = champion is not None and existing is not None and str(champion.version) == str(existing.version)
            if not source:
                promoted, reason = False, "the best trial saved no checkpoint"
            elif already and existing is not None:
                promoted, reason = True, f"version {existing.version} is already the champion (a retry): nothing to do"
            else:
                champion_tags = tags_of(champion) if champion is not None else {}
                incomparable = None
                if champion is not None and tagged_value(champion_tags) is None:
                    incomparable = f"champion version {champion.version} has no {TAG}value tag (not ours)"
                elif champion is not None and champion_tags.get(TAG + "metric") != metric:
                    incomparable = (
                        f"champion version {champion.version} was promoted on "
                        f"{champion_tags.get(TAG + 'metric')!r}, not {metric!r}"
                    )
                promoted, reason = gate_decision(
                    self.gate,
                    metric=metric,
                    mode=mode,
                    value=value,
                    threshold=threshold,
                    has_champion=champion is not None,
                    champion_value=tagged_value(champion_tags),
                    incomparable=incomparable,
                )
            described = describe(champion) if champion is not None else None
            out: dict[str, Any] = {
                **decision_record(promoted, reason, champion=described, metric=metric, mode=mode, value=value),
                "registered_model": name,
                "version_name": version_name,
                "tracking_uri": hook.tracking_uri,
                "model_version_url": None,
            }
            self.returned = out
            if not promoted:
                # Nothing registered: the registry holds the versions that won, as the S3 registry does.
                return self.not_promoted(context, out)

            version = existing
            registry_owner.claim_mlflow(registry, claim)  # creates the model (with its DAGs) when it is new
            assert version_name is not None and digest is not None
            folder = version_folder_uri(str(source), name, version_name)
            if version is None:
                run_id = result.get("mlflow", {}).get("best_run_id") if isinstance(result.get("mlflow"), dict) else None
                tags = version_tags(result, context, version_name, digest, str(source))
                model_source, files = self.mlflow_model_source(result, version_name, objects, tags, context)
                version = registry.create_version(model_source, run_id, tags)
            else:
                files = self.files_of_existing(folder, result, tags_of(version), context)
            version = registry.wait_ready(version)
            if not already:
                # The alias moves last: a deploy reading models:/<name>@champion sees the old or the new, complete one.
                registry.set_alias(CHAMPION_ALIAS, str(version.version))

        number = str(version.version)
        made = tags_of(version)
        out.update(
            {
                "version": number,
                "uri": f"{version_folder_uri(str(source), name, str(version_name))}/{CHECKPOINT_ARTIFACT}",
                "model_uri": f"{MODELS_PREFIX}{name}/{number}",
                "model_version_url": hook.model_version_url(name, number),
                "mlflow_model": made.get(MODEL_TAG) or None,
                "mlflow_model_uri": made.get(MODEL_URI_TAG),
                "mlflow_model_digest": made.get(MODEL_DIGEST_TAG),
                "registry": self.registry_uri,
                "version_folder": folder,
                **record.xcom_fields(files, context),
            }
        )
        self.log.info("Promoted %s as version %s of MLflow model %r: %s", source, number, name, reason)
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = {
                    "version": number,
                    "value": value,
                    "metric": metric,
                    "model_uri": out["model_uri"],
                    **record.event_extra(self.registry_uri, number, folder, files),
                }
        return out

    def mlflow_model_source(
        self,
        result: dict[str, Any],
        version_name: str,
        objects: Sequence[dict[str, Any]],
        tags: dict[str, str],
        context: Context,
    ) -> tuple[str, dict[str, str]]:
        """The new version's source, and its model tags (``tags`` updated), and the files registered (the
        promotion's record, :mod:`~airflow_tune.registries.record`). The checkpoint is copied, its bytes proven on
        the way (:func:`~airflow_tune.registries.transfer.copy_proven`), to ``checkpoint/`` of the version's own
        folder (:func:`~airflow_tune.registries.mlflow.version_folder_uri`); the source is that folder as an MLflow
        Model built with the loader, or the copy itself (an MLflow Model already, or a bare checkpoint)."""
        from airflow_tune.common.provenance import CHECKPOINT_FILES_KEY
        from airflow_tune.registries import record
        from airflow_tune.registries.mlflow import (
            MODEL_DIGEST_TAG,
            MODEL_TAG,
            MODEL_URI_TAG,
            TAG,
            registered_model_name,
            version_folder_uri,
        )
        from airflow_tune.registries.mlflow_model import CHECKPOINT_ARTIFACT
        from airflow_tune.registries.s3 import split_s3_uri
        from airflow_tune.registries.transfer import copy_proven

        source = str(result["best_checkpoint_uri"])
        kind = self.model_kind(result, self.registry_uri)
        folder = version_folder_uri(source, registered_model_name(self.registry_uri), version_name)
        bucket, prefix = split_s3_uri(folder)
        s3 = self.s3_client()
        files = result.get(CHECKPOINT_FILES_KEY) or {}
        copied = copy_proven(s3, source, objects, files, bucket, f"{prefix}/{CHECKPOINT_ARTIFACT}")
        copy = f"{folder}/{CHECKPOINT_ARTIFACT}"
        written: dict[str, str] = {}
        model_source = copy
        if kind == "pyfunc":
            uri, model_digest, written = self.write_model(s3, result, bucket, prefix, version_name)
            tags.update({MODEL_TAG: "pyfunc", MODEL_URI_TAG: uri, MODEL_DIGEST_TAG: model_digest})
            model_source = uri
        elif kind == "checkpoint":
            tags.update({MODEL_TAG: "checkpoint", MODEL_URI_TAG: copy, MODEL_DIGEST_TAG: tags[TAG_DIGEST]})
        registered = record.registered_files({c["key"]: c["digest"] for c in copied}, written)
        record.write_stored(s3, folder, registered, context)
        tags[TAG + record.DIGEST_KEY] = record.files_digest(registered)
        return model_source, registered

    def files_of_existing(
        self, folder: str, result: dict[str, Any], tags: dict[str, str], context: Context
    ) -> dict[str, str]:
        """A version an earlier try registered: its folder's files hashed from the bytes read now, believed only when
        the checkpoint's are the sealed result's and the whole folder's digest is the one that try recorded."""
        from airflow_tune.common.provenance import CHECKPOINT_FILES_KEY, differences
        from airflow_tune.registries import record
        from airflow_tune.registries.mlflow import MODEL_DIGEST_TAG, TAG

        s3 = self.s3_client()
        files = record.hash_folder(s3, folder)
        sealed = result.get(CHECKPOINT_FILES_KEY) or {}
        checkpoint = record.part(files, "checkpoint")
        model_digest = tags.get(MODEL_DIGEST_TAG)
        recorded = tags.get(TAG + record.DIGEST_KEY)
        if (
            checkpoint != sealed
            or (recorded and recorded != record.files_digest(files))
            or (tags.get(TAG + "model") == "pyfunc" and model_digest != record.files_digest(files))
        ):
            raise PromotionError(
                f"the files of {folder} changed since an earlier try registered them "
                f"({differences(sealed, checkpoint) if checkpoint != sealed else 'the model files differ'}): "
                "not recording them as this promotion's; remove the version and promote again"
            )
        record.write_stored(s3, folder, files, context)
        return files
