"""The MLflow server's own virtualenv (``make mlflow-venv``; ``AIRFLOW_TUNE_MLFLOW_PYTHON`` overrides it), and its
REST API read as plain HTTP (no mlflow import on the test side)."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
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
