"""Two DAGs that run the same experiment, blocking and deferred, and load the winner downstream."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG, task

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")


def build(dag_id: str, deferrable: bool) -> DAG:
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"]) as dag:
        tune_task = RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.functions:checkpointing",
            storage_path=STORAGE,
            metric="loss",
            mode="min",
            param_space={"x": {"grid_search": [1, 3]}, "steps": 3},
            checkpoint={"num_to_keep": 2},
            py_modules=[TESTKIT],
            progress_interval_s=1.0,
            poll_interval=1.0,
            deferrable=deferrable,
        )

        @task
        def use_winner(result: dict) -> dict:
            import json
            import os
            import tempfile

            from airflow_tune.checkpoints import download_checkpoint

            with tempfile.TemporaryDirectory() as folder:
                download_checkpoint(result["best_checkpoint_uri"], folder)
                with open(os.path.join(folder, "state.json")) as fh:
                    state = json.load(fh)
            return {"x": result["best_config"]["x"], "checkpoint_x": state["x"], "checkpoint_loss": state["loss"]}

        use_winner(tune_task.output)
    return dag


blocking = build("tune_roundtrip_blocking", deferrable=False)
deferred = build("tune_roundtrip_deferred", deferrable=True)
