"""How PromoteCheckpointOperator makes the winner an MLflow Model (:mod:`airflow_tune.registries.mlflow_model`):
what a promotion registers, and the model's files beside the checkpoint's copy. The same for both registries (S3 and
MLflow's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_tune.common.provenance import CHECKPOINT_FILES_KEY
from airflow_tune.exceptions import PromotionError
from airflow_tune.registries import mlflow_model


class ModelWriting:
    """PromoteCheckpointOperator's MLflow Model steps (a mixin: ``loader``, ``model_*`` are the operator's)."""

    if TYPE_CHECKING:
        loader: mlflow_model.LoaderSpec | None
        model_requirements: Any
        model_signature: Any
        model_input_example: Any
        log: Any

    def model_kind(self, result: dict[str, Any], registry: str) -> str | None:
        """What a promotion registers: ``"pyfunc"`` (an MLflow Model built around the checkpoint with
        ``model_loader``), ``"checkpoint"`` (the checkpoint is an MLflow Model already: registered as it is) or None
        (a bare checkpoint, which MLflow's clients cannot load: said in the task log)."""
        if mlflow_model.holds_mlflow_model(result.get(CHECKPOINT_FILES_KEY)):
            if self.loader is not None:
                self.log.info(
                    "The checkpoint holds an MLflow Model (MLmodel at its top): registering it as it is; "
                    "model_loader %s is not used",
                    self.loader.source,
                )
            return "checkpoint"
        if self.loader is not None:
            return "pyfunc"
        self.log.warning(
            "Registering the best checkpoint into %s as a bare Tune checkpoint: MLflow's clients "
            "(mlflow.pyfunc.load_model, mlflow models serve, KServe/MLServer's MLflow runtimes) cannot load it (no "
            "MLmodel); airflow_tune.checkpoints.download_checkpoint can. Give model_loader= (a "
            "mlflow.pyfunc.PythonModel subclass or a load(checkpoint_dir) function) to register an MLflow Model",
            registry,
        )
        return None

    def write_model(
        self, s3: Any, result: dict[str, Any], bucket: str, prefix: str, version: str
    ) -> tuple[str, str, dict[str, str]]:
        """Build the MLflow Model's files around the checkpoint (:func:`airflow_tune.registries.mlflow_model.build`)
        and put them under ``s3://bucket/prefix``, where the checkpoint's objects are copied to ``checkpoint/``;
        returns the model folder's URI, the digest of all its files and the digests of the files written here (of
        the bytes written: what the promotion's record holds)."""
        import os
        import shutil
        import tempfile

        assert self.loader is not None
        scratch = tempfile.mkdtemp(prefix="aft-promote-model-")
        try:
            folder = os.path.join(scratch, "model")
            try:
                written = mlflow_model.build(
                    folder,
                    self.loader,
                    checkpoint_uri=str(result.get("best_checkpoint_uri")),
                    requirements=self.model_requirements,
                    signature=self.model_signature,
                    input_example=self.model_input_example,
                    metadata={
                        "airflow_tune.version": version,
                        "airflow_tune.experiment": str(result.get("experiment")),
                    },
                )
            except ImportError as exc:
                raise PromotionError(
                    f"model_loader needs MLflow on this worker (pip install 'airflow-tune[mlflow]'): {exc}"
                ) from exc
            mlflow_model.upload(s3, folder, bucket, prefix)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        files = mlflow_model.model_files(written, result.get(CHECKPOINT_FILES_KEY) or {})
        digest = mlflow_model.model_digest(files)
        self.log.info("Wrote the MLflow Model s3://%s/%s (loader %s): %s", bucket, prefix, self.loader.source, digest)
        return f"s3://{bucket}/{prefix}", digest, dict(written)
