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


def _state(tmp_path, pid: int, started_at: dict[str, float]) -> None:
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
