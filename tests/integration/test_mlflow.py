"""The local stack's MLflow tracking server (issue 24): a real ``mlflow server`` from its own virtualenv, its store in
the stack's folder and its artifacts on the stack's S3 endpoint; Tune's MLflow logger, named in the spec, logs each
trial there from the cluster virtualenv's driver; and the server is stopped by its process id with the stack (also
when the stack's owner is killed: tests/integration/test_local_cluster.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from airflow_tune.local import LocalStack, load_state
from airflow_tune.local.stack import stop_process_tree
from tests.conftest import separate_stack
from tests.support import engine_jobs as jobs
from tests.support.mlflow_server import MlflowRest, mlflow_python, params, tags
from tests.support.processes import alive, tree


@pytest.fixture(scope="module")
def tracked() -> Iterator:
    """A Ray head run by the cluster virtualenv (it holds the MLflow client Tune's logger imports, as the Ray image
    does), the S3 endpoint and an MLflow server; stopped, and checked that nothing of it is left, even when tests
    fail."""
    with separate_stack("mlflow-", num_cpus=2, mlflow_python=mlflow_python(), airflow=False) as local:
        yield local.state


def test_tunes_mlflow_logger_named_in_the_spec_logs_one_run_per_trial_with_config_and_metric_history(tracked):
    state = tracked
    name = jobs.unique_name("mlflow")
    experiment = f"airflow-tune-{name}"
    spec = jobs.base_spec(
        state,
        name,
        "tune_testkit.functions:quadratic",
        param_space={"x": {"grid_search": [1, 3]}, "steps": 3},
        callbacks=[{"name": "mlflow", "args": {"tracking_uri": state.mlflow_url, "experiment_name": experiment}}],
    )
    _, manifest = jobs.run_ok(state, spec)
    rest = MlflowRest(state.mlflow_url)
    found = rest.get("experiments/get-by-name", experiment_name=experiment)["experiment"]
    # Artifacts go through the server's proxy to its destination on S3, not to a path on the driver's node.
    assert found["artifact_location"].startswith("mlflow-artifacts:")
    runs = rest.runs(found["experiment_id"])
    assert len(runs) == len(manifest["trials"]) == 2, [tags(r).get("trial_name") for r in runs]
    for trial in manifest["trials"]:
        [run] = [r for r in runs if tags(r)["trial_name"].endswith(trial["trial_id"])]
        assert run["info"]["status"] == "FINISHED"
        x = trial["config"]["x"]
        assert params(run) == {"x": str(x), "steps": "3"}
        history = sorted(rest.history(run["info"]["run_id"], "loss"), key=lambda m: m["step"])
        # One point per reported result, at its training_iteration.
        assert [m["step"] for m in history] == [1, 2, 3]
        assert [m["value"] for m in history] == pytest.approx([(x - 3) ** 2 + 1.0 / (s + 1) for s in range(3)])
        assert history[-1]["value"] == pytest.approx(trial["metrics"]["loss"])


def test_the_compose_healthcheck_passes_on_the_real_server_and_fails_on_a_wrong_answer(tracked, tmp_path):
    """docker/docker-compose.yaml's check of its mlflow service, as compose resolves it, against this stack's server
    (its port put in for 5000); something else answering there is not a healthy server."""
    from tests.integration.test_healthchecks import http_server, run_check
    from tests.unit.local.test_compose import ENV_EXAMPLE, compose_config

    env = tmp_path / "env"
    shutil.copy(ENV_EXAMPLE, env)
    test = compose_config(env)["services"]["mlflow"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    done = run_check(test[3], {5000: tracked.mlflow_port})
    assert done.returncode == 0, done.stderr
    with http_server(lambda path: (200, b"{}")) as port:
        assert run_check(test[3], {5000: port}).returncode != 0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_tune.local", *args], capture_output=True, text=True, timeout=300
    )


def test_up_serves_mlflow_with_its_store_in_the_stack_and_artifacts_on_s3_and_down_stops_it(tmp_path):
    """The CLI's path (``make up``): ``up --mlflow-python`` starts the server, ``env`` points clients and Airflow at it,
    and ``down`` stops it by the pid the state file recorded, its uvicorn worker with it. (``LocalStack.stop`` is
    checked the same way when the module's stack stops.)"""
    import boto3

    root = tmp_path / "s"
    up = _cli("up", "--root", str(root), "--mlflow-python", str(mlflow_python()))
    started: set[int] = set()
    try:
        assert up.returncode == 0, up.stderr
        state = load_state(root)
        assert state is not None and state.mlflow_pid is not None and state.mlflow_url is not None
        assert f"MLflow:        {state.mlflow_url}" in up.stdout
        assert str(state.mlflow_pid) in state.started_at
        started = tree(state.mlflow_pid)
        assert len(started) >= 2, "mlflow server runs its uvicorn worker as a child"
        env = _cli("env", "--root", str(root)).stdout
        assert f"export MLFLOW_TRACKING_URI={state.mlflow_url}\n" in env
        assert "AIRFLOW_CONN_MLFLOW_DEFAULT=" in env
        assert f"(pid {state.mlflow_pid})" in _cli("status", "--root", str(root)).stdout
        rest = MlflowRest(state.mlflow_url)
        experiment_id = rest.post("experiments/create", {"name": "probe"})["experiment_id"]
        run = rest.post("runs/create", {"experiment_id": experiment_id})["run"]
        # mlflow-artifacts:/<experiment>/<run>/artifacts, proxied to s3://<bucket>/mlflow/<experiment>/<run>/...
        scheme, _, path = run["info"]["artifact_uri"].partition(":")
        assert scheme == "mlflow-artifacts"
        rest.put_artifact(f"{path.lstrip('/')}/hello.txt", b"hello")
        keys = state.s3_env()
        s3 = boto3.client(
            "s3",
            endpoint_url=state.s3_endpoint,
            region_name=keys["AWS_DEFAULT_REGION"],
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        )
        key = f"{state.mlflow_artifacts_uri.split('/', 3)[3]}/{path.lstrip('/')}/hello.txt"
        assert s3.get_object(Bucket=state.bucket, Key=key)["Body"].read() == b"hello"
        assert (root / "mlflow" / "mlflow.db").is_file()
    finally:
        down = _cli("down", "--root", str(root))
        for pid in alive(started):  # only if down failed: never leave the server running
            stop_process_tree(pid, grace=2)
    assert down.returncode == 0, down.stderr
    assert started and alive(started) == set()
    assert not (root / LocalStack.STATE_FILE).exists()
