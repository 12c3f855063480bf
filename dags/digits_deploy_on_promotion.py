"""Deploy whatever the registry's champion is, each time a promotion updates the registry (an Asset event).

With MLflow's Model Registry (the default) it loads ``models:/digits@champion``, the version under the alias, an MLflow
Model: ``download_model`` checks its checkpoint is the one its trial wrote and its other files the ones its promotion
wrote, and ``mlflow.pyfunc.load_model`` loads that copy (MLflow's own client would load a forged version too).
"""

from __future__ import annotations

from airflow.sdk import DAG, task
from digits_common import REGISTRY, champion_uri

# [START howto_deploy_on_promotion]
with DAG(
    dag_id="digits_deploy_on_promotion",
    schedule=[REGISTRY],
    catchup=False,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def deploy_champion(**context) -> dict:
        import tempfile

        import mlflow.pyfunc
        from digits_tuning.serve import holdout_accuracy

        from airflow_tune.checkpoints import download_model

        # The promotion that started this run names its version (none when the run was triggered by hand).
        try:
            events = list(context["triggering_asset_events"][REGISTRY])
        except KeyError:
            events = []
        version = events[-1].extra.get("version") if events else None
        uri = champion_uri()
        # The champion's MLflow Model, downloaded and verified (the checkpoint as its trial wrote it, the loader as
        # its promotion wrote it), then loaded by MLflow's own pyfunc loader, as a serving image would.
        with tempfile.TemporaryDirectory(prefix="champion-") as folder:
            download_model(uri, folder)
            score = holdout_accuracy(mlflow.pyfunc.load_model(folder))
        print(f"[airflow-tune] serving {uri} (version {version}): held-out accuracy {score:.4f}")
        return {"version": version, "model_uri": uri, "holdout_accuracy": score}

    deploy_champion()
# [END howto_deploy_on_promotion]
