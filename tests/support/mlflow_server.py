"""The MLflow server's own virtualenv (``make mlflow-venv``; ``AIRFLOW_TUNE_MLFLOW_PYTHON`` overrides it), and its
REST API read as plain HTTP (no mlflow import on the test side)."""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MLFLOW_PYTHON = Path(os.environ.get("AIRFLOW_TUNE_MLFLOW_PYTHON", REPO_ROOT / ".mlflow-venv" / "bin" / "python"))


def mlflow_python() -> Path:
    """The MLflow server virtualenv's Python; fails the test (never skips it) when the virtualenv was not built."""
    if not os.access(MLFLOW_PYTHON.parent / "mlflow", os.X_OK):
        pytest.fail(f"no MLflow virtualenv at {MLFLOW_PYTHON.parent.parent}: build it with `make mlflow-venv`")
    return MLFLOW_PYTHON


class MlflowRest:
    """The tracking server's REST API (``/api/2.0/mlflow/...``)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        url = f"{self.url}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            return dict(json.load(resp))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return dict(json.load(resp))

    def put_artifact(self, path: str, data: bytes) -> None:
        """Upload through the server's artifact proxy (``mlflow-artifacts``), which writes to its destination."""
        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow-artifacts/artifacts/{path}", data=data, method="PUT"
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert resp.status == 200

    def runs(self, experiment_id: str) -> list[dict[str, Any]]:
        found = self.post("runs/search", {"experiment_ids": [experiment_id], "max_results": 1000})
        return list(found.get("runs", []))

    def history(self, run_id: str, key: str) -> list[dict[str, Any]]:
        return list(self.get("metrics/get-history", run_id=run_id, metric_key=key).get("metrics", []))


def params(run: dict[str, Any]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


@contextlib.contextmanager
def mlflow_beside(state: Any, folder: Path) -> Iterator[str]:
    """An MLflow server (its store in ``folder``, artifacts on ``state``'s S3 endpoint) beside a running stack, for
    modules that need the registry but not a Ray head of their own; the ``mlflow_default`` connection points at it
    while the block runs. Stopped by its process id (its uvicorn child too), with the reaper as a backstop, even when
    the block fails."""
    from airflow_tune.local.ports import free_port, wait_http
    from airflow_tune.local.processes import Processes
    from airflow_tune.local.services import mlflow_connection, mlflow_url, start_mlflow
    from airflow_tune.local.stack import MLFLOW_START_TIMEOUT
    from tests.conftest import _environment

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(exist_ok=True)
    processes = Processes(folder / "logs", outlive_owner=False)
    processes.start_reaper()
    try:
        port = free_port()
        proc = start_mlflow(processes, mlflow_python(), port, folder / "mlflow", state.s3_endpoint, state.bucket)
        url = mlflow_url(port)
        wait_http(f"{url}/health", MLFLOW_START_TIMEOUT, proc, "MLflow server", ok_below=400)
        env = {"AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(mlflow_connection(url)), "MLFLOW_TRACKING_URI": url}
        with _environment(env):
            yield url
    finally:
        processes.stop()
