"""The state file of a running local stack (``<root>/stack.json``): what the stack is, how to reach it, and what to
stop; ``python -m airflow_tune.local env|status|down`` work from it in another process than the one that started the
stack."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from airflow_tune.local.processes import is_alive, process_started_at, stop_process_tree
from airflow_tune.local.services import MLFLOW_ARTIFACTS_PREFIX, airflow_env, mlflow_url, s3_endpoint, s3_env

STATE_FILE = "stack.json"


@dataclass
class StackState:
    """What a running stack is: enough to reach it and to stop it from another process."""

    root: str
    ray_temp_dir: str
    ray_pid: int
    s3_pid: int
    gcs_port: int
    dashboard_port: int
    s3_port: int
    bucket: str
    airflow_home: str
    #: The multi-node shape (``workers=N``): worker node processes, temp dirs and Ray node ids, by worker index.
    worker_pids: list[int] = field(default_factory=list)
    worker_temp_dirs: list[str] = field(default_factory=list)
    worker_node_ids: list[str] = field(default_factory=list)
    head_node_id: str | None = None
    #: The Python every Ray node runs (the cluster virtualenv's), or None when Ray runs in this environment.
    cluster_python: str | None = None
    #: When each recorded process started (``psutil``'s create time, by pid), so ``down`` stops a recorded pid only
    #: while it is still the process the stack started: after a reboot the same pid may be anybody's.
    started_at: dict[str, float] = field(default_factory=dict)
    #: Ray's token: every node runs in token mode with it, and clients send it (the ``ray_default`` connection's
    #: password); None for a stack started with ``auth=False``.
    auth_token: str | None = None
    #: The MLflow tracking server (a stack started with ``mlflow_python``): its process and port, or None.
    mlflow_pid: int | None = None
    mlflow_port: int | None = None

    @property
    def mlflow_url(self) -> str | None:
        """The tracking server's URL (``MLFLOW_TRACKING_URI`` for clients), or None when the stack runs none."""
        return mlflow_url(self.mlflow_port) if self.mlflow_port else None

    @property
    def mlflow_artifacts_uri(self) -> str:
        """Where the tracking server stores run artifacts (its ``--artifacts-destination``)."""
        return f"s3://{self.bucket}/{MLFLOW_ARTIFACTS_PREFIX}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def s3_endpoint(self) -> str:
        return s3_endpoint(self.s3_port)

    @property
    def storage_uri(self) -> str:
        return f"s3://{self.bucket}/experiments"

    def s3_env(self) -> dict[str, str]:
        return s3_env(self.s3_endpoint)

    def airflow_env(self) -> dict[str, str]:
        return airflow_env(self.airflow_home, self.dashboard_port, self.auth_token, self.mlflow_url)

    @property
    def auth_headers(self) -> dict[str, str]:
        """The headers a client of the dashboard sends (``Authorization: Bearer <token>``, or none)."""
        return {"Authorization": f"Bearer {self.auth_token}"} if self.auth_token else {}

    def __repr__(self) -> str:  # never the token
        auth = "token" if self.auth_token else "off"
        return f"StackState(root={self.root!r}, dashboard={self.dashboard_url}, auth={auth})"

    def env(self) -> dict[str, str]:
        """Environment for clients of the stack: Ray Jobs, S3, Airflow and, when the stack runs one, MLflow
        (``MLFLOW_TRACKING_URI``). The token reaches Airflow only as the ``ray_default`` connection's password, as in
        production; a client process stays out of Ray's token mode."""
        env = {
            **self.s3_env(),
            **self.airflow_env(),
            "RAY_AUTH_MODE": "disabled",
            "AIRFLOW_TUNE_DASHBOARD_URL": self.dashboard_url,
            "AIRFLOW_TUNE_STORAGE_URI": self.storage_uri,
        }
        if self.mlflow_url:
            env["MLFLOW_TRACKING_URI"] = self.mlflow_url
        return env

    def pids(self) -> list[int]:
        """Every process the stack recorded, in the order they are stopped: workers, the MLflow server, the head,
        the S3 endpoint."""
        mlflow = [self.mlflow_pid] if self.mlflow_pid else []
        return [*self.worker_pids, *mlflow, self.ray_pid, self.s3_pid]


def write_state(root: str | os.PathLike[str], state: StackState) -> None:
    """Write ``state`` under ``root``, with the start time of each recorded process as it is now."""
    state.started_at = {str(pid): t for pid in state.pids() if (t := process_started_at(pid)) is not None}
    (Path(root) / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))


def load_state(root: str | os.PathLike[str]) -> StackState | None:
    state_file = Path(root) / STATE_FILE
    if not state_file.exists():
        return None
    return StackState(**json.loads(state_file.read_text()))


def is_recorded_process(state: StackState, pid: int) -> bool:
    """Whether ``pid`` is still the process the stack recorded: alive, and started when it was recorded as started.

    A state file without start times (written before they were kept) is trusted as before.
    """
    if not is_alive(pid):
        return False
    recorded = state.started_at.get(str(pid))
    if recorded is None:
        return not state.started_at
    now = process_started_at(pid)
    return now is not None and abs(now - recorded) < 1.0


def stop_from_state(root: str | os.PathLike[str]) -> list[int]:
    """Stop a stack started by another process (``up``), by the process ids it recorded, each only while it is still
    the process that was started (a stale state file, e.g. after a reboot, must not stop anybody else's process)."""
    state = load_state(root)
    if state is None:
        return []
    stopped = []
    for pid in state.pids():
        if is_recorded_process(state, pid):
            stopped += stop_process_tree(pid)
        elif is_alive(pid):
            print(f"pid {pid} is not the process the stack started (it started at another time): left alone")
    for folder in (state.ray_temp_dir, *state.worker_temp_dirs):
        shutil.rmtree(folder, ignore_errors=True)
    (Path(root) / STATE_FILE).unlink(missing_ok=True)
    return stopped
