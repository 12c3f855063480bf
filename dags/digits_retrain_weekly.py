"""Weekly retraining: tune an MLP on the digits with ASHA and per-epoch checkpoints, promote the winner only if it
beats the deployed champion, then deploy it and smoke-test it on held-out data.

Warm start: the search tries the current champion's config first, so next week's run starts from this week's best.
The promoted version is an MLflow Model (``digits_tuning.pyfunc.DigitsClassifier`` around the checkpoint), so MLflow's
clients load it; the smoke test loads only a copy ``airflow_tune.checkpoints.download_model`` verified, since MLflow's
own loader runs whatever the version's files hold.
The registry is MLflow's (``models:/digits``, through the ``mlflow_default`` connection) unless
AIRFLOW_TUNE_REGISTRY_URI names another; the winner becomes a model version and the ``champion`` alias moves to it.
With MLflow, each trial is also an MLflow run (experiment ``airflow-tune/digits_retrain_weekly/tune``, a parent run per
DAG run), and the version names the best trial's run.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task
from digits_common import (
    INPUT_EXAMPLE,
    MODEL_LOADER,
    MODEL_REQUIREMENTS,
    REGISTRY_DAGS,
    REGISTRY_URI,
    SHIP_TRAINABLES,
    STORAGE_URI,
    TRACK_IN_MLFLOW,
)

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator

with DAG(
    dag_id="digits_retrain_weekly",
    schedule="@weekly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_ray_tune]
    tune = RayTuneOperator(
        task_id="tune",
        trainable="digits_tuning.trainables:train_mlp",
        storage_path=STORAGE_URI,
        metric="val_accuracy",
        mode="max",
        param_space={
            "lr": {"loguniform": [1e-3, 1e-1]},
            "alpha": {"loguniform": [1e-6, 1e-2]},
            "hidden": {"choice": [16, 32, 64]},
            "epochs": 8,
        },
        num_samples=6,
        max_concurrent_trials=2,
        scheduler={"name": "asha", "args": {"max_t": 8, "grace_period": 2, "reduction_factor": 2}},
        # The 2 best by the metric (Tune keeps the 2 newest unless told by what to score them).
        checkpoint={"num_to_keep": 2, "score_attribute": "val_accuracy", "score_order": "max"},
        warm_start=REGISTRY_URI,
        mlflow_tracking=TRACK_IN_MLFLOW,
        progress_interval_s=2.0,
        poll_interval=2.0,
        deferrable=True,
        **SHIP_TRAINABLES,
    )
    # [END howto_operator_ray_tune]

    # [START howto_operator_promote_checkpoint]
    promote = PromoteCheckpointOperator(
        task_id="promote",
        result=tune.output,
        registry_uri=REGISTRY_URI,
        registry_dags=REGISTRY_DAGS,  # both example DAGs promote into the digits registry
        gate="better_than_champion",
        # The version becomes an MLflow Model around the checkpoint, which MLflow's clients load and serve.
        model_loader=MODEL_LOADER,
        model_input_example=INPUT_EXAMPLE,
        model_requirements=MODEL_REQUIREMENTS,
    )
    # [END howto_operator_promote_checkpoint]

    # [START howto_deploy_promoted_model]
    @task
    def deploy_and_smoke_test(decision: dict) -> dict:
        """Load the promoted model as a serving image would, from a copy ``download_model`` verified (its checkpoint
        byte for byte as its trial wrote it, every file as the promotion registered it, by the promote task's XCom):
        MLflow's own
        ``mlflow.pyfunc.load_model("models:/digits/<version>")`` would run whatever loader the version's source holds
        now. Then score it on the held-out test set."""
        import tempfile

        import mlflow.pyfunc
        from digits_tuning.serve import holdout_accuracy

        from airflow_tune.checkpoints import download_model

        uri = decision["model_uri"] if decision["model_uri"].startswith("models:/") else REGISTRY_URI
        # Verified against Airflow's record of this promotion (the promote task's XCom): a writer of the registry
        # who swaps a file and recomputes the digests stored beside it is refused, naming the file.
        with tempfile.TemporaryDirectory() as folder:
            score = holdout_accuracy(mlflow.pyfunc.load_model(download_model(uri, folder, promotion=decision)))
        if score < 0.8:
            raise ValueError(f"the promoted model scores {score:.3f} on held-out data, below the 0.8 floor")
        print(f"[airflow-tune] deployed version {decision['version']}: held-out accuracy {score:.4f}")
        return {"version": decision["version"], "holdout_accuracy": score}

    deploy_and_smoke_test(promote.output)
    # [END howto_deploy_promoted_model]
