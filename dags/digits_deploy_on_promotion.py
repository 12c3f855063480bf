"""Deploy whatever the registry's champion is, each time a promotion updates the registry (an Asset event)."""

from __future__ import annotations

from airflow.sdk import DAG, task
from digits_common import REGISTRY, REGISTRY_URI

with DAG(
    dag_id="digits_deploy_on_promotion",
    schedule=[REGISTRY],
    catchup=False,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def deploy_champion() -> dict:
        from digits_tuning.serve import holdout_score, load_model

        from airflow_tune.registry import read_champion

        champion = read_champion(REGISTRY_URI)
        if champion is None:
            raise ValueError(f"no champion in {REGISTRY_URI}: nothing to deploy")
        score = holdout_score(load_model(champion["uri"]))
        print(f"[airflow-tune] serving version {champion['version']}: held-out accuracy {score:.4f}")
        return {"version": champion["version"], "holdout_accuracy": score}

    deploy_champion()
