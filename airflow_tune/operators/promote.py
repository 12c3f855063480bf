"""PromoteCheckpointOperator: promote a tuning winner into a model registry when it passes a gate.

Two registries: one on S3 (``s3://bucket/models/<name>``, :mod:`airflow_tune.registries.s3`'s layout), and MLflow's
Model Registry (``models:/<name>``, :mod:`airflow_tune.registries.mlflow`: a model version whose source is the
version's own folder, and the ``champion`` alias moved last). Either way the checkpoint is copied through the worker
and every file's bytes proven on the way (:mod:`airflow_tune.registries.transfer`) before anything else is written,
and the pointer (``champion.json``, or the alias) moves last, so a reader never sees a half-copied version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from airflow_tune.common import jsonsafe
from airflow_tune.common.contract import inside_experiment
from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY, CHECKPOINT_FILES_KEY
from airflow_tune.exceptions import PromotionError
from airflow_tune.operators.promote_mlflow import MLflowPromotion
from airflow_tune.operators.promote_model import ModelWriting
from airflow_tune.registries import mlflow_model, promote_written, record
from airflow_tune.registries import owner as registry_owner
from airflow_tune.registries.gates import GATES, beats, decision_record, gate_decision
from airflow_tune.registries.mlflow import is_mlflow_uri, registered_model_name
from airflow_tune.registries.s3 import (
    CHAMPION_FILE,
    check_listing,
    list_checkpoint,
    model_card,
    read_champion,
    s3_client,
    split_s3_uri,
    version_name,
)
from airflow_tune.registries.transfer import copy_proven
from airflow_tune.registry import registry_asset
from airflow_tune.trust import code
from airflow_tune.trust.submitted import SubmittedJobs
from airflow_tune.utils.version_compat import SkipMixin

__all__ = [
    "CHAMPION_FILE",
    "GATES",
    "PromoteCheckpointOperator",
    "PromotionError",
    "beats",
    "registry_asset",
    "split_s3_uri",
]

if TYPE_CHECKING:
    from airflow.sdk import Context


class PromoteCheckpointOperator(MLflowPromotion, ModelWriting, BaseOperator, SkipMixin):
    """Promote the best checkpoint of a tuning run into a model registry (on S3, or MLflow's) when it passes a gate.

    Returns what it did: ``promoted``, ``version``, ``uri`` (the promoted checkpoint), ``model_uri``, ``reason``
    and ``champion`` (what it compared with). When it promotes, the registry's Asset (:func:`registry_asset`) gets an
    event; when it does not, no Asset event is emitted and, with ``skip_downstream_if_not_promoted``, its direct
    downstream tasks are skipped. A retry of a promotion that already moved the champion changes nothing and emits
    the same event.

    With an MLflow registry (``models:/<name>``) a promotion registers the checkpoint as a version of ``<name>`` (the
    checkpoint's S3 location as its source; metric, config, experiment and Airflow run as ``airflow_tune.*`` tags;
    the best trial's MLflow run when the result has one), only when the gate passes, and moves the alias ``champion``
    to it last; ``version`` is MLflow's version number and ``model_uri`` ``models:/<name>/<version>``. A registry
    error fails the task with the alias unmoved; its retry finds the version an earlier try created by its tag.

    :param result: the XCom result of :class:`~airflow_tune.operators.tune.RayTuneOperator` (e.g. ``tune.output``).
    :param registry_uri: the registry: ``s3://bucket/models/<name>``, or ``models:/<name>`` for MLflow's Model
        Registry. Written in the DAG file: rendered, it is refused unless it is an ``s3://`` one under the root the
        DAG file wrote before a template or the deployment allows (see :mod:`airflow_tune.registries.promote_written`).
        A registry belongs to DAGs, by id: the first DAG that promotes into it owns it, and another DAG's promotion
        (or load) is refused unless ``registry_dags`` says otherwise (:mod:`airflow_tune.registries.owner`).
    :param gate: ``always``, ``better_than_champion`` (on the experiment's metric and mode) or ``threshold``; not
        templated (``threshold`` is).
    :param threshold: with ``gate="threshold"``: promote when the best value reaches it (by the mode).
    :param skip_downstream_if_not_promoted: skip the direct downstream tasks when the winner is not promoted.
    :param aws_conn_id: an Amazon connection for S3 (needs ``apache-airflow-providers-amazon``); by default boto3's
        own credential chain (environment, instance role).
    :param mlflow_conn_id: the MLflow tracking server's connection, for a ``models:/`` registry (not looked up for
        an S3 one); see :class:`~airflow_tune.hooks.mlflow.MLflowHook`.
    :param registry_dags: the ids of the other DAGs that share this registry (a scheduled retraining and a tuning
        run from the UI): a DAG promotes into a registry only when every DAG that promotes into it lists it, so
        each of them writes the same list (its own id may be in it). Not templated, never mapped from an XCom; the
        deployment's ``[airflow_tune] registry_dags`` overrides it for the registries it names.
    :param ray_conn_id: the Ray cluster that ran the experiment: ``result`` is data (an XCom, a template), so the
        experiment's ``result.json`` is read again and promoted only when the Ray job it names vouches for its bytes
        in its log (see :mod:`airflow_tune.common.provenance`).
    :param model_loader: makes the promoted version an MLflow Model that ``mlflow.pyfunc.load_model`` and ``mlflow
        models serve`` load (:mod:`airflow_tune.registries.mlflow_model`): a ``mlflow.pyfunc.PythonModel`` subclass (its
        ``load_context`` reads ``context.artifacts["checkpoint"]``) or a function ``load(checkpoint_dir) -> model``
        (the model's ``predict`` is served), as an object or an import path ``"package.module:name"`` (the Python
        modules of its top-level package travel in the model's ``code/``). Code: written in the DAG file, never
        rendered, and refused when ``expand()`` maps it from an XCom. Without it a checkpoint that holds an MLflow
        Model (``MLmodel`` at its top) is registered as it is, and any other is registered as a bare checkpoint that
        MLflow's clients cannot load (the task log says so).
    :param model_signature: the model's signature (a ``mlflow.models.ModelSignature`` or its ``to_dict()`` form);
        by default the input example's inputs.
    :param model_input_example: saved with the model (a list of rows of numbers is a 2-D float array).
    :param model_requirements: the loader's pip requirements (e.g. ``["scikit-learn==1.9.1"]``), recorded beside
        ``mlflow`` and ``cloudpickle``; what a model's server installs, so written in the DAG file (refused when
        ``expand()`` maps it from an XCom).
    """

    template_fields: Sequence[str] = ("result", "registry_uri", "threshold")
    template_fields_renderers = {"result": "json"}
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        result: dict[str, Any] | str,
        registry_uri: str,
        gate: str = "better_than_champion",
        threshold: float | str | None = None,
        skip_downstream_if_not_promoted: bool = True,
        aws_conn_id: str | None = None,
        mlflow_conn_id: str = "mlflow_default",
        ray_conn_id: str = "ray_default",
        registry_dags: Sequence[str] = (),
        registry_owner: Any = None,
        model_loader: Any = None,
        model_signature: Any = None,
        model_input_example: Any = None,
        model_requirements: Sequence[str] = (),
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [registry_asset(registry_uri)] if "{{" not in registry_uri else [])
        super().__init__(**kwargs)
        self.result = result
        self.registry_uri = registry_uri
        self.gate = gate
        # Where the winner goes and how it is judged, as the DAG file wrote them: rendered ones are refused at execute.
        self.written_targets = promote_written.Written.of(registry_uri, gate)
        self.threshold = threshold
        self.skip_downstream_if_not_promoted = skip_downstream_if_not_promoted
        self.aws_conn_id = aws_conn_id
        self.mlflow_conn_id = mlflow_conn_id
        self.ray_conn_id = ray_conn_id
        if registry_owner is not None:
            raise TypeError(
                f"registry_owner = {registry_owner!r}: a registry now belongs to DAG ids, not to a name any DAG file "
                "can write: list the DAGs that share it instead, in each of their files, e.g. "
                "registry_dags=['retrain_dag', 'tune_from_ui_dag']"
            )
        if isinstance(registry_dags, str) or not all(isinstance(d, str) and d for d in registry_dags):
            raise TypeError(f"registry_dags = {registry_dags!r}: give a list of DAG ids")
        self.registry_dags = tuple(registry_dags)
        # The loader is code: checked now (parse time, nothing imported), never a template field.
        self.model_loader = model_loader
        self.loader = mlflow_model.loader_spec(model_loader)
        if isinstance(model_requirements, str) or not all(isinstance(r, str) for r in model_requirements):
            raise TypeError(f"model_requirements = {model_requirements!r}: give a list of pip requirement strings")
        if model_signature is not None and not isinstance(model_signature, dict):
            if type(model_signature).__name__ != "ModelSignature":
                raise TypeError(
                    f"model_signature = {type(model_signature).__name__}: give a mlflow.models.ModelSignature or its "
                    "to_dict() form"
                )
        if self.loader is None and (model_signature is not None or model_input_example is not None):
            raise ValueError("model_signature and model_input_example describe the model model_loader builds: give one")
        self.model_signature = model_signature
        self.model_input_example = model_input_example
        self.model_requirements = list(model_requirements)
        self.returned: dict[str, Any] | None = None  # the decision, for lineage

    # -- inputs -------------------------------------------------------------------------------------------------
    def _inputs(self) -> tuple[dict[str, Any], float | None]:
        result = json.loads(self.result) if isinstance(self.result, str) else self.result
        if not isinstance(result, dict) or "best_metrics" not in result or "metric" not in result:
            raise TypeError(
                "result must be the RayTuneOperator's XCom result (a dict with best_metrics, best_checkpoint_uri, "
                f"metric, mode), got {type(result).__name__}"
                + (f" with keys {sorted(result)}" if isinstance(result, dict) else "")
            )
        if result.get("mode") not in ("min", "max"):
            raise ValueError(f"result['mode'] = {result.get('mode')!r}: the experiment's mode must be 'min' or 'max'")
        checkpoint, experiment_uri = result.get("best_checkpoint_uri"), str(result.get("experiment_uri") or "")
        if checkpoint and not inside_experiment(checkpoint, experiment_uri):
            # The checkpoint is unpickled by deploy tasks: only one the experiment wrote is promoted.
            raise ValueError(
                f"result['best_checkpoint_uri'] = {str(checkpoint)[:300]!r} lies outside result['experiment_uri'] = "
                f"{experiment_uri[:300]!r}: promote only a checkpoint of the experiment (pass the RayTuneOperator's "
                "XCom result as it is)"
            )
        if is_mlflow_uri(self.registry_uri):
            registered_model_name(self.registry_uri)
        else:
            bucket, prefix = split_s3_uri(self.registry_uri)
            if not prefix:
                raise ValueError(
                    f"registry_uri = {self.registry_uri!r}: give a prefix, e.g. s3://{bucket}/models/digits "
                    "(or models:/digits for MLflow)"
                )
        if self.gate not in GATES:
            raise ValueError(f"gate = {self.gate!r}: use one of {', '.join(GATES)}")
        threshold: float | None = None
        if self.gate == "threshold":
            try:
                threshold = float(self.threshold)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(f"threshold = {self.threshold!r}: gate='threshold' needs a number") from None
            if not math.isfinite(threshold):
                raise ValueError(f"threshold = {self.threshold!r}: gate='threshold' needs a finite number")
        return result, threshold

    def registry_claim(self) -> registry_owner.Claim:
        """This task's claim on its registry: its DAG, the DAGs its file shares the registry with, and the
        deployment's list for the registry (``registry_dags`` mapped from an XCom is refused before: it is one of
        :data:`~airflow_tune.trust.code.PROMOTE_CODE_ARGUMENTS`)."""
        return registry_owner.Claim.of(
            self.dag_id, self.registry_dags, registry_owner.deployment_dags(self.registry_uri)
        )

    def s3_client(self) -> Any:
        return s3_client(self.aws_conn_id)

    def proven_result(self, given: dict[str, Any], context: Context) -> dict[str, Any]:
        """The experiment's own result, re-read from storage and believed only when the Ray job it names vouches for
        its bytes, ran for this DAG and is one Airflow recorded the tune task submitting
        (:mod:`airflow_tune.trust.submitted`); ``given`` (the XCom, data) must agree with it on what is promoted."""
        from airflow_tune.common import storage
        from airflow_tune.common.contract import RESULT_FILE, manifest_uri, result_succeeded, xcom_result
        from airflow_tune.exceptions import ExperimentStorageError
        from airflow_tune.hooks.ray import RayHook
        from airflow_tune.trust import proofs

        experiment_uri = str(given.get("experiment_uri") or "")
        where = manifest_uri(experiment_uri, RESULT_FILE)
        try:
            storage.location(experiment_uri)
            data = storage.read_bytes(where)
        except (ValueError, OSError) as exc:
            raise PromotionError(f"cannot read the experiment's result at {where[:300]}: {exc}") from exc
        try:
            manifest = proofs.proven_result(
                RayHook(self.ray_conn_id),
                experiment_uri,
                data,
                owner={"dag_id": self.dag_id},
                submitted=SubmittedJobs(context, self.log),
                same_dag_only=True,
            )
        except ExperimentStorageError as exc:
            raise PromotionError(f"not promoting: {exc}") from exc
        if not result_succeeded(manifest):
            raise PromotionError(f"not promoting: the experiment at {experiment_uri} did not succeed")
        for key in ("experiment", "best_trial_id", "best_checkpoint_uri", "metric", "mode"):
            if given.get(key) != manifest.get(key):
                raise PromotionError(
                    f"result[{key!r}] = {str(given.get(key))[:300]!r} is not what the experiment's sealed result says "
                    f"({str(manifest.get(key))[:300]!r}): pass the RayTuneOperator's XCom result as it is"
                )
        out = xcom_result(manifest, manifest.get("job_id"), None)
        out[CHECKPOINT_FILES_KEY] = manifest.get(CHECKPOINT_FILES_KEY)
        return out

    # -- execute ------------------------------------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        promote_written.check_task(self)
        # The loader, its requirements and the registry's owner are the DAG file's: never an XCom's.
        code.refuse_mapped_code(self, code.PROMOTE_CODE_ARGUMENTS)
        given, threshold = self._inputs()
        result = self.proven_result(given, context)
        if is_mlflow_uri(self.registry_uri):
            return self.execute_mlflow(context, result, threshold)
        bucket, prefix = split_s3_uri(self.registry_uri)
        s3 = self.s3_client()
        claim = self.registry_claim()
        registry_owner.check_s3(s3, self.registry_uri, claim)
        metric, mode = result["metric"], result["mode"]
        value = (result.get("best_metrics") or {}).get(metric)
        champion = read_champion(self.registry_uri, s3)
        champion_value = champion.get("value") if champion else None
        source = result.get("best_checkpoint_uri")
        # Listed before the gate: the version is named from the checkpoint itself, so a retry finds it again.
        objects = list_checkpoint(s3, str(source)) if source else []
        if source:
            check_listing(result, objects)
        version = version_name(result, objects) if objects else None

        if not source:
            decision = (False, "the best trial saved no checkpoint")
        elif champion is not None and champion.get("version") == version:
            # A retry after the pointer moved (e.g. the task died before its Asset event was recorded): finish the
            # same promotion again rather than comparing the winner with itself and skipping the deploy.
            decision = (True, f"version {version} is already the champion: promoting it again (a retry)")
        else:
            decision = gate_decision(
                self.gate,
                metric=metric,
                mode=mode,
                value=value,
                threshold=threshold,
                has_champion=champion is not None,
                champion_value=champion_value,
            )
        promoted, reason = decision
        out = decision_record(promoted, reason, champion=champion, metric=metric, mode=mode, value=value)
        self.returned = out
        if not promoted:
            return self.not_promoted(context, out)
        kind = self.model_kind(result, self.registry_uri)

        if version is None:
            raise PromotionError(f"no objects found under the checkpoint {source}")
        registry_owner.claim_s3(s3, self.registry_uri, claim)
        version_prefix = f"{prefix}/versions/{version}"
        # The bytes registered are the bytes read and proved: a file changed since the trial wrote it fails here,
        # before model.json or champion.json is written.
        copied = copy_proven(
            s3,
            str(source),
            objects,
            result.get(CHECKPOINT_FILES_KEY) or {},
            bucket,
            f"{version_prefix}/{mlflow_model.CHECKPOINT_ARTIFACT}",
        )
        model = model_card(context, result, version, copied)
        mlflow_uri, mlflow_digest, written = None, None, dict[str, str]()
        if kind == "pyfunc":
            # The version's folder is the MLflow Model: MLmodel and the loader beside the checkpoint's copy.
            mlflow_uri, mlflow_digest, written = self.write_model(s3, result, bucket, version_prefix, version)
        elif kind == "checkpoint":
            mlflow_uri, mlflow_digest = f"s3://{bucket}/{version_prefix}/checkpoint", result.get(CHECKPOINT_DIGEST_KEY)
        model["mlflow_model"] = {"kind": kind, "uri": mlflow_uri, "digest": mlflow_digest}
        # What Airflow's record (this XCom, the Asset event) vouches for: every file written, from the bytes handled.
        folder = f"s3://{bucket}/{version_prefix}"
        files = record.registered_files({c["key"]: c["digest"] for c in copied}, written)
        registered = record.xcom_fields(files, context)
        model.update({k: registered[k] for k in (record.DIGEST_KEY, record.PROMOTED_BY_KEY)})
        record.write_stored(s3, folder, files, context)
        s3.put_object(
            Bucket=bucket,
            Key=f"{version_prefix}/model.json",
            Body=jsonsafe.dumps(model, indent=1).encode(),
            ContentType="application/json",
        )
        pointer = {
            "version": version,
            "uri": f"s3://{bucket}/{version_prefix}/checkpoint",
            "model_uri": f"s3://{bucket}/{version_prefix}/model.json",
            "metric": metric,
            "mode": mode,
            "value": value,
            "config": result.get("best_config"),
            "experiment": result.get("experiment"),
            "experiment_uri": result.get("experiment_uri"),
            "trial_id": result.get("best_trial_id"),
            "source_checkpoint_uri": source,
            "checkpoint_digest": result.get(CHECKPOINT_DIGEST_KEY),
            "mlflow_model_uri": mlflow_uri,
            "mlflow_model_digest": mlflow_digest,
            "promoted_at": model["promoted_at"],
            record.DIGEST_KEY: registered[record.DIGEST_KEY],
            record.PROMOTED_BY_KEY: registered[record.PROMOTED_BY_KEY],
        }
        # The pointer moves last: readers see the old champion or the complete new one.
        s3.put_object(
            Bucket=bucket,
            Key=f"{prefix}/{CHAMPION_FILE}",
            Body=jsonsafe.dumps(pointer, indent=1).encode(),
            ContentType="application/json",
        )
        self.log.info("Promoted %s as version %s (%d objects): %s", source, version, len(copied), reason)
        out.update(
            {
                "version": version,
                "uri": pointer["uri"],
                "model_uri": pointer["model_uri"],
                "mlflow_model_uri": mlflow_uri,
                "mlflow_model_digest": mlflow_digest,
                "registry": self.registry_uri.rstrip("/"),
                "version_folder": folder,
                **registered,
            }
        )
        extra = record.event_extra(self.registry_uri, version, folder, files)
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = {"version": version, "value": value, "metric": metric, **extra}
        return out

    def not_promoted(self, context: Context, out: dict[str, Any]) -> dict[str, Any]:
        """Return the decision of a winner held back: no registry change, so no Asset event for the deploy DAGs;
        its direct downstream tasks skipped when asked."""
        self.log.info("Not promoting: %s", out["reason"])
        self.outlets = []
        if self.skip_downstream_if_not_promoted:
            downstream = [t for t in context["task"].get_direct_relatives(upstream=False) if not t.is_teardown]
            if downstream:
                # Skipping ends execute() (the SDK raises DownstreamTasksSkipped): keep the decision first.
                context["ti"].xcom_push(key="return_value", value=out)
                self.skip(ti=context["ti"], tasks=downstream)
        return out

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (called by its provider's listener): the best checkpoint read; with a promotion, the registry
        version written and the registry whose champion moved; the gate's decision as run parameters
        (:func:`~airflow_tune.utils.lineage_parameters.promote_parameters`). Never raises."""
        from airflow_tune.utils import lineage, lineage_parameters

        def names() -> tuple[list[lineage.Name], list[lineage.Name]]:
            result = json.loads(self.result) if isinstance(self.result, str) else self.result
            source = result.get("best_checkpoint_uri") if isinstance(result, dict) else None
            return lineage.promote_dataset_names(self.returned, source, self.registry_uri)

        return lineage.operator_lineage(
            names, self.log, lambda: lineage_parameters.promote_parameters(self.returned, self.gate, self.threshold)
        )
