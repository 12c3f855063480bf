"""Deploy whatever the registry's champion is, each time a promotion updates the registry (an Asset event).

With MLflow's Model Registry (the default) it loads ``models:/digits@champion``: the version under the alias, whose
checkpoint is checked to be the one the promotion registered before it is unpickled.
"""

from __future__ import annotations

from airflow.sdk import DAG, task
from digits_common import REGISTRY, champion_checkpoint

with DAG(
    dag_id="digits_deploy_on_promotion",
    schedule=[REGISTRY],
    catchup=False,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def deploy_champion(**context) -> dict:
        from digits_tuning.serve import holdout_score, load_model

        # The promotion that started this run names its version (none when the run was triggered by hand).
        try:
            events = list(context["triggering_asset_events"][REGISTRY])
        except KeyError:
            events = []
        version = events[-1].extra.get("version") if events else None
        uri, digest = champion_checkpoint()
        score = holdout_score(load_model(uri, digest))
        print(f"[airflow-tune] serving {uri} (version {version}): held-out accuracy {score:.4f}")
        return {"version": version, "model_uri": uri, "holdout_accuracy": score}

    deploy_champion()
