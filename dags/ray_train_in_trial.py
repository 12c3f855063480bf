"""Ray Train inside each trial: tune the learning rate of a two-worker data-parallel run, promote the best Train
checkpoint and load it downstream.

Each trial is a function trainable (``train_in_trial.trainables:train_driver``) that runs a Ray Train
``DataParallelTrainer`` of two workers with Tune's ``TuneReportCallback``; the Train run keeps its checkpoints in the
trial's own folder, and the best one by the metric is the XCom's ``best_checkpoint_uri``. Ray Train places its workers
in a placement group of its own, outside the trial's: ``resources_per_trial.train_workers`` declares them, so the
feasibility check counts them, and ``max_concurrent_trials`` keeps the concurrent Train runs within the cluster
(Tune counts only the trial's own resources).
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task
from train_in_trial import PACKAGE_DIR

from airflow_tune.operators.promote import PromoteCheckpointOperator
from airflow_tune.operators.tune import RayTuneOperator

STORAGE_URI = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
REGISTRY_URI = os.environ.get("AIRFLOW_TUNE_TRAIN_REGISTRY_URI", "s3://airflow-tune/models/line")
#: The Train run of each trial: what the trainable's ScalingConfig asks for, declared for the feasibility check.
NUM_WORKERS, WORKER_CPUS = 2, 0.5

with DAG(
    dag_id="ray_train_in_trial",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-tune", "example"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_ray_tune_train_workers]
    tune = RayTuneOperator(
        task_id="tune",
        trainable="train_in_trial.trainables:train_driver",
        storage_path=STORAGE_URI,
        metric="loss",
        mode="min",
        param_space={
            "lr": {"grid_search": [0.02, 0.2]},
            "epochs": 2,
            "num_workers": NUM_WORKERS,
            "worker_cpus": WORKER_CPUS,
        },
        # The trial's function only drives the Train run: half a CPU; its workers come on top.
        resources_per_trial={
            "cpu": 0.5,
            "train_workers": {"num_workers": NUM_WORKERS, "per_worker": {"cpu": WORKER_CPUS}},
        },
        max_concurrent_trials=1,
        progress_interval_s=2.0,
        poll_interval=2.0,
        py_modules=[PACKAGE_DIR],
    )
    # [END howto_operator_ray_tune_train_workers]

    # [START howto_load_promoted_checkpoint]
    promote = PromoteCheckpointOperator(
        task_id="promote",
        result=tune.output,
        registry_uri=REGISTRY_URI,
        gate="always",
    )

    @task
    def load_model(result: dict, decision: dict) -> dict:
        """Download the promoted Train checkpoint and read the model rank 0 saved in it."""
        import json
        import tempfile
        from pathlib import Path

        from airflow_tune.checkpoints import download_checkpoint
        from airflow_tune.registry import champion_checkpoint

        # The version this promotion registered, as its experiment's Ray job vouches for it, its bytes verified
        # once downloaded against Airflow's record of the promotion (the promote task's XCom).
        uri, digest = champion_checkpoint(REGISTRY_URI, promotion=decision)
        with tempfile.TemporaryDirectory() as folder:
            download_checkpoint(uri, folder, expected_digest=digest, promotion=decision)
            files = sorted(p.name for p in Path(folder).iterdir())
            model = json.loads((Path(folder) / "model.json").read_text())
        print(f"[airflow-tune] version {decision['version']}: w={model['w']:.3f} b={model['b']:.3f} files {files}")
        return {
            "version": decision["version"],
            "files": files,
            "model": model,
            "best_loss": result["best_metrics"]["loss"],
        }

    load_model(tune.output, promote.output)
    # [END howto_load_promoted_checkpoint]
