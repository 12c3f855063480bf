"""The engine on every Ray release of the compatibility tier: a cluster of that release (its own virtualenv, S3
endpoint and Airflow home) runs, through RayTuneOperator, trainables of every form: an import path shipped with
``working_dir``, and a function and a class defined in the DAG file, pickled by value with this side's Ray.

One cluster per release, one DAG run of three tasks of two short trials each (blocking); the tests print their
duration. Measured on 2 cores for 2.43.0: the stack starts in 28 s, the DAG run takes 139 s (about 30 s per Ray job,
plus about 30 s before the first task of a process starts)."""

from __future__ import annotations

import os
import shutil
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from tests.e2e.helpers import load_dag, run_dag
from tests.support.compat_envs import RAY_RELEASES, ray_cluster_python
from tests.support.compat_stack import compat_stack
from tests.support.mlflow_server import MlflowRest, mlflow_beside, tags

TASKS = ("tune_import_path", "tune_function", "tune_class")

#: The import-path trainable, in a module of its own that only ``working_dir`` brings to the cluster.
PROBE = """
import os
import shutil
import tempfile

import ray
from ray import tune


def train(config):
    for step in range(2):
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "step.txt"), "w") as fh:
            fh.write(str(step))
        metrics = {"loss": float((config["x"] - 3) ** 2) + 1.0 / (step + 1), "ray_version": ray.__version__}
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
"""


@pytest.fixture(scope="module")
def working_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="aft-release-probe-"))
    (folder / "release_probe.py").write_text(textwrap.dedent(PROBE))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AFT_RELEASE_WORKING_DIR", str(folder))
            yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module", params=RAY_RELEASES)
def release_stack(request, working_dir) -> Iterator[tuple[str, object]]:
    """A Ray head of ``release`` run by its cluster virtualenv, an S3 endpoint and the session's Airflow home; the
    environment points Ray Jobs, S3 and Airflow clients at it while the release's tests run."""
    release = request.param
    options = {"num_cpus": 2, "cluster_python": ray_cluster_python(release), "airflow_home": os.environ["AIRFLOW_HOME"]}
    with compat_stack(f"Ray {release} stack", f"aft-ray-{release}-", **options) as (state, root):
        # A tracking server for the engine's MLflow callback on this release (the cluster virtualenv has the MLflow
        # client, as the Ray image does).
        with mlflow_beside(state, root / "mlflow-beside") as mlflow_url, pytest.MonkeyPatch.context() as patch:
            patch.setenv("AFT_RELEASE_MLFLOW", "1")
            yield release, state, mlflow_url


@pytest.mark.timeout(300)
def test_every_trainable_form_runs_on_the_release(release_stack):
    import boto3

    from airflow_tune.hooks.ray import RayHook

    release, state, mlflow_url = release_stack
    assert RayHook().check_ray_version() == release

    date = datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = run_dag(load_dag("aft_ray_releases", "ray_releases.py"), logical_date=date)
    print(f"Ray {release}: the DAG run of {len(TASKS)} tasks took {run.seconds:.1f}s")
    assert run.state == "success", (run.task_states(), {t: run.errors(t) for t in TASKS})

    s3 = boto3.client("s3", endpoint_url=state.s3_endpoint, region_name="us-east-1")
    for task_id in TASKS:
        result = run.xcom(task_id)
        assert set(result) == set(RESULT_KEYS), (task_id, result)
        assert result["best_config"] == {"x": 3}, (task_id, result)
        assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["num_errored"] == 0, result
        # The trials ran on the cluster of this release, not with this side's Ray.
        assert result["best_metrics"]["ray_version"] == release, (task_id, result["best_metrics"])
        assert result["best_metrics"]["loss"] == pytest.approx(0.5)
        uri = result["best_checkpoint_uri"]
        assert uri and uri.startswith(f"{result['experiment_uri'].rstrip('/')}/"), (task_id, result)
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/")
        assert listed.get("KeyCount", 0) > 0, f"{task_id}: no checkpoint objects under {uri}"

    # The class's trials were tracked by the engine's MLflow callback on this release: a run per trial under the
    # parent, each with its loss at both iterations; the other tasks were not tracked.
    assert [run.xcom(t)["mlflow"] for t in TASKS if t != "tune_class"] == [None] * (len(TASKS) - 1)
    tracking = run.xcom("tune_class")["mlflow"]
    rest = MlflowRest(mlflow_url)
    trial_runs = [
        r
        for r in rest.runs(tracking["experiment_id"])
        if tags(r).get("mlflow.parentRunId") == tracking["parent_run_id"]
    ]
    assert len(trial_runs) == 2 and {r["info"]["status"] for r in trial_runs} == {"FINISHED"}, trial_runs
    for trial_run in trial_runs:
        assert sorted(m["step"] for m in rest.history(trial_run["info"]["run_id"], "loss")) == [1, 2]
