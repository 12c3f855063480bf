"""Deploy whatever the registry's champion is, each time a promotion updates the registry (an Asset event).

With MLflow's Model Registry (the default) it loads the version the triggering Asset event's promotion registered, an
MLflow Model: ``download_model`` checks every file against Airflow's record of that promotion (the event, made by the
promote task) and its checkpoint against its trial's, and ``mlflow.pyfunc.load_model`` loads that copy (MLflow's own
client would load a forged version too).
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

        # The promotion that started this run: Airflow's record of what it registered (none when the run was
        # triggered by hand: then download_model finds the champion's promote task and its XCom itself).
        try:
            events = list(context["triggering_asset_events"][REGISTRY])
        except KeyError:
            events = []
        promotion = events[-1] if events else None
        version = promotion.extra.get("version") if promotion is not None else None
        uri = champion_uri()
        # The promoted MLflow Model, downloaded and verified against that record (every file as the promotion
        # registered it, the checkpoint as its trial wrote it; an event created through the REST API is refused),
        # then loaded by MLflow's own pyfunc loader, as a serving image would.
        with tempfile.TemporaryDirectory(prefix="champion-") as folder:
            download_model(uri, folder, promotion=promotion)
            score = holdout_accuracy(mlflow.pyfunc.load_model(folder))
        print(f"[airflow-tune] serving {uri} (version {version}): held-out accuracy {score:.4f}")
        return {"version": version, "model_uri": uri, "holdout_accuracy": score}

    deploy_champion()
# [END howto_deploy_on_promotion]
