"""The local stack starts, serves Ray and S3, and stops every process it started, also when the body raises."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import pytest

from airflow_tune.local import LocalStack
from tests.support.processes import alive, tree


def _serves(state) -> None:
    import boto3

    request = urllib.request.Request(f"{state.dashboard_url}/api/version", headers=state.auth_headers)
    with urllib.request.urlopen(request, timeout=10) as resp:
        version = json.load(resp)
    assert version["ray_version"] == "2.60.0"
    if state.auth_token:  # token auth is on by default, as in Ray 2.59+: no token, no answer
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{state.dashboard_url}/api/version", timeout=10)
        assert refused.value.code == 401
    s3 = boto3.client("s3", endpoint_url=state.s3_endpoint, region_name="us-east-1", **_keys(state))
    s3.put_object(Bucket=state.bucket, Key="probe/hello.txt", Body=b"hello")
    assert s3.get_object(Bucket=state.bucket, Key="probe/hello.txt")["Body"].read() == b"hello"


def _keys(state) -> dict[str, str]:
    env = state.s3_env()
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def test_a_stack_serves_runs_a_job_and_stops_clean_also_when_the_body_raises(tmp_path, monkeypatch):
    """The ``with`` path the tests and the demo use (its normal exit is the session stack's and ``down``'s path), on the
    one cluster of the suite with Ray's auth disabled: clients that send no token are served and run a job.

    Its first head exits before serving, as ``ray start`` does when its dashboard is slower than it waits for (20 s
    before Ray 2.60) on a loaded machine: the stack starts the head once more."""
    import sys

    from airflow_tune.hooks.ray import RayHook
    from tests.support.engine_jobs import wait

    local = LocalStack(tmp_path / "s", airflow=False, auth=False)
    real_start = local._nodes.start
    heads: list[int] = []

    def first_head_exits(temp_dir, gcs_port, dashboard_port, s3_port, *, worker):
        if not heads:
            proc = local._processes.spawn([sys.executable, "-c", "raise SystemExit(1)"], "ray.log", dict(os.environ))
        else:
            proc = real_start(temp_dir, gcs_port, dashboard_port, s3_port, worker=worker)
        heads.append(dashboard_port)
        return proc

    local._nodes.start = first_head_exits  # type: ignore[method-assign]
    started: set[int] = set()
    with pytest.raises(RuntimeError, match="boom"):
        with local as state:
            assert len(heads) == 2 and state.dashboard_port == heads[1] != heads[0]
            assert state.auth_token is None and state.auth_headers == {}
            _serves(state)
            for key, value in state.env().items():
                monkeypatch.setenv(key, value)
            assert "password" not in json.loads(os.environ["AIRFLOW_CONN_RAY_DEFAULT"])
            hook = RayHook()
            job_id = hook.submit_job(entrypoint="python -c \"print('no auth')\"", submission_id="noauth-1")
            assert wait(state, job_id, timeout=60) == "SUCCEEDED"
            assert "no auth" in hook.get_job_logs(job_id)
            started = tree(state.ray_pid) | tree(state.s3_pid)
            assert len(started) > 3, "a Ray head runs several processes"
            ray_temp_dir = state.ray_temp_dir
            raise RuntimeError("boom")
    assert started and alive(started) == set()
    assert not (tmp_path / "s" / "stack.json").exists()
    assert not os.path.exists(ray_temp_dir)


def test_cli_up_env_down(tmp_path):
    import subprocess
    import sys

    root = str(tmp_path / "cli")
    up = subprocess.run(
        [sys.executable, "-m", "airflow_tune.local", "up", "--root", root],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert up.returncode == 0, up.stderr
    from airflow_tune.local import load_state

    state = load_state(root)
    assert state is not None
    try:
        env = subprocess.run(
            [sys.executable, "-m", "airflow_tune.local", "env", "--root", root],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"AWS_ENDPOINT_URL={state.s3_endpoint}" in env.stdout
        assert "AIRFLOW_CONN_RAY_DEFAULT=" in env.stdout
        started = tree(state.ray_pid) | tree(state.s3_pid)
        _serves(state)
        _users_own_dag_test_runs_after_eval_env(root, tmp_path)
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "airflow_tune.local", "down", "--root", root],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert down.returncode == 0 and "stopped" in down.stdout
    assert alive(started) == set()


USER_DAG = """
import os
from airflow.sdk import DAG
from airflow_tune.operators.tune import RayTuneOperator

def train(config):
    return {"loss": (config["x"] - 2) ** 2}

with DAG("my_first_tuning", schedule=None) as dag:
    RayTuneOperator(
        task_id="tune",
        trainable=train,
        storage_path=os.environ["AIRFLOW_TUNE_STORAGE_URI"],
        metric="loss",
        mode="min",
        param_space={"x": {"grid_search": [1, 2, 3]}},
        poll_interval=0.5,
    )

if __name__ == "__main__":
    run = dag.test()
    print("RUN_STATE", run.state)
"""


def _users_own_dag_test_runs_after_eval_env(root: str, tmp_path) -> None:
    """The README's path: ``eval "$(python -m airflow_tune.local env)"``, then a user's DAG file runs dag.test()."""
    import subprocess
    import sys

    project = tmp_path / "my_project"
    (project / "dags").mkdir(parents=True)
    (project / "dags" / "my_first_dag.py").write_text(USER_DAG)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "AWS_"))}
    script = (
        f'eval "$({sys.executable} -m airflow_tune.local env --root {root})" && {sys.executable} dags/my_first_dag.py'
    )
    out = subprocess.run(["bash", "-c", script], cwd=project, env=clean, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "RUN_STATE success" in out.stdout, (out.stdout[-3000:], out.stderr[-3000:])


def test_services_stop_when_their_owner_is_killed(tmp_path):
    """A test run or demo killed with SIGKILL (or a CI time-out) leaves no Ray head or S3 endpoint behind."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import json, sys, time\n"
        "from airflow_tune.local import LocalStack\n"
        f"state = LocalStack({str(tmp_path / 's')!r}, airflow=False).start()\n"
        "print(json.dumps([state.ray_pid, state.s3_pid, state.ray_temp_dir]), flush=True)\n"
        "time.sleep(600)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started: set[int] = set()
    ray_temp_dir = None
    try:
        assert owner.stdout is not None
        ray_pid, s3_pid, ray_temp_dir = json.loads(owner.stdout.readline())
        started = tree(ray_pid) | tree(s3_pid)
        assert len(started) > 3
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 60
        while alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(started) == set()
    finally:
        from airflow_tune.local.stack import stop_process_tree

        for pid in alive(started):
            stop_process_tree(pid, grace=2)
        if owner.poll() is None:
            owner.kill()
        if ray_temp_dir:  # the owner died before it could remove it
            import shutil

            shutil.rmtree(ray_temp_dir, ignore_errors=True)
