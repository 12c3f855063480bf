"""``python -m airflow_tune.local down`` stops a recorded pid only while it is still the process the stack started:
a stale state file (after a reboot, pids are reused) must not stop anybody else's process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import psutil

from airflow_tune.local import LocalStack
from airflow_tune.local.processes import process_started_at
from airflow_tune.local.state import StackState, stop_from_state


def _state(tmp_path, pid: int, started_at: dict[str, float], **fields) -> None:
    state = StackState(
        root=str(tmp_path),
        ray_temp_dir=str(tmp_path / "ray"),
        ray_pid=pid,
        s3_pid=pid,
        gcs_port=1,
        dashboard_port=2,
        s3_port=3,
        bucket="b",
        airflow_home=str(tmp_path / "airflow"),
        started_at=started_at,
        **fields,
    )
    (tmp_path / LocalStack.STATE_FILE).write_text(json.dumps(asdict(state)))


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)


def test_a_pid_that_is_now_another_process_is_left_alone(tmp_path):
    other = _sleeper()
    try:
        started = process_started_at(other.pid)
        assert started is not None
        _state(tmp_path, other.pid, {str(other.pid): started - 3600})  # "the stack's" process started an hour before
        assert stop_from_state(tmp_path) == []
        assert psutil.pid_exists(other.pid) and other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_the_recorded_process_itself_is_stopped(tmp_path):
    ours = _sleeper()
    try:
        _state(tmp_path, ours.pid, {str(ours.pid): process_started_at(ours.pid) or 0.0})
        assert ours.pid in stop_from_state(tmp_path)
        assert ours.wait(timeout=20) is not None
        assert not (tmp_path / LocalStack.STATE_FILE).exists()
    finally:
        if ours.poll() is None:
            ours.kill()


def test_the_recorded_mlflow_server_is_stopped_with_the_rest(tmp_path):
    """``down`` stops the MLflow server by its recorded pid too (the head and S3 pids here are another process)."""
    head, server = _sleeper(), _sleeper()
    try:
        recorded = {str(p.pid): process_started_at(p.pid) or 0.0 for p in (head, server)}
        _state(tmp_path, head.pid, recorded, mlflow_pid=server.pid, mlflow_port=4)
        stopped = stop_from_state(tmp_path)
        assert server.pid in stopped and head.pid in stopped
        assert server.wait(timeout=20) is not None
    finally:
        for proc in (head, server):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _plain_state(**fields) -> StackState:
    return StackState(
        root="/r",
        ray_temp_dir="/t",
        ray_pid=10,
        s3_pid=11,
        gcs_port=1,
        dashboard_port=2,
        s3_port=3,
        bucket="b",
        airflow_home="/r/airflow",
        **fields,
    )


def test_a_stack_with_mlflow_gives_clients_its_url_and_airflow_the_mlflow_default_connection():
    from airflow.sdk import Connection

    state = _plain_state(mlflow_pid=12, mlflow_port=5005, worker_pids=[20])
    assert state.mlflow_url == "http://127.0.0.1:5005"
    assert state.mlflow_artifacts_uri == "s3://b/mlflow"
    env = state.env()
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5005"
    # The MLflow provider's hook type (http) with the tracking URI as host, as that provider and HttpHook read it.
    conn = Connection.from_json(env["AIRFLOW_CONN_MLFLOW_DEFAULT"], conn_id="mlflow_default")
    assert (conn.conn_type, conn.host, conn.login, conn.password) == ("http", "http://127.0.0.1:5005", None, None)
    # Stopped before the head (workers first), and recorded with the others for ``down``.
    assert state.pids() == [20, 12, 10, 11]
    without = _plain_state()
    assert without.mlflow_url is None and without.pids() == [10, 11]
    assert "MLFLOW_TRACKING_URI" not in without.env() and "AIRFLOW_CONN_MLFLOW_DEFAULT" not in without.env()
    # A state file written before the MLflow fields existed still loads.
    old = {k: v for k, v in asdict(without).items() if not k.startswith("mlflow_")}
    assert StackState(**old).mlflow_url is None


def test_the_mlflow_server_is_bound_to_loopback_with_its_store_in_the_stack_and_a_clean_environment(
    tmp_path, monkeypatch
):
    from airflow_tune.local.services import mlflow_server_args, mlflow_server_env

    monkeypatch.setenv("AIRFLOW_CONN_SECRET_THING", "x")
    args = mlflow_server_args("/venv/bin/mlflow", 5005, tmp_path / "mlflow", "b")
    flags = dict(zip(args[2::2], args[3::2], strict=True))
    assert args[:2] == ["/venv/bin/mlflow", "server"]
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "5005" and flags["--workers"] == "1"
    assert flags["--backend-store-uri"] == f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    assert flags["--artifacts-destination"] == "s3://b/mlflow"
    env = mlflow_server_env(tmp_path / "venv" / "bin" / "python", tmp_path / "mlflow", "http://127.0.0.1:9")
    assert env["MLFLOW_S3_ENDPOINT_URL"] == env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert env["PATH"].split(":")[0] == str(tmp_path / "venv" / "bin")
    assert env["HOME"] == str(tmp_path / "mlflow")
    assert "AIRFLOW_CONN_SECRET_THING" not in env and not any(k.startswith("AIRFLOW") for k in env)


def test_a_stack_asked_for_mlflow_without_its_virtualenv_says_how_to_build_it(tmp_path):
    import pytest

    from airflow_tune.local import StackError
    from airflow_tune.local.processes import Processes
    from airflow_tune.local.services import start_mlflow

    processes = Processes(tmp_path, outlive_owner=False)
    with pytest.raises(StackError, match=r"make mlflow-venv"):
        start_mlflow(processes, tmp_path / "nowhere" / "bin" / "python", 5005, tmp_path / "m", "http://x", "b")
    assert processes.started == []
