"""The cluster must run the Ray version of the Airflow side: the engine runs there with the cluster's Ray.

A dashboard on loopback answers like a Ray dashboard of another version: the operator fails before anything is
submitted, saying both versions. (The real clusters of the other tests run the same version; their jobs run.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from importlib.metadata import version
from types import SimpleNamespace
from unittest import mock

import pytest

from airflow_tune.exceptions import RayConnectionError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from tests.support.json_http import JsonHandler


class _Dashboard(JsonHandler):
    """Answers GET /api/version with ``ray_version`` and GET /api/jobs/ with no jobs; records every request."""

    ray_version: str | None = "2.59.0"
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).seen.append(("GET", self.path))
        if self.path == "/api/version":
            body: dict = {"version": "4", "ray_commit": "x", "session_name": "s"}
            if self.ray_version is not None:
                body["ray_version"] = self.ray_version
            self._answer(200, body)
        elif self.path == "/api/jobs/":
            self._answer(200, [])
        else:
            self._answer(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        type(self).seen.append(("POST", self.path))
        self._answer(500, {"error": "nothing may be submitted"})

    do_PUT = do_POST  # noqa: N815 - uploads of py_modules


@pytest.fixture
def dashboard(monkeypatch) -> Iterator[type[_Dashboard]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard)
    _Dashboard.seen = []
    _Dashboard.ray_version = "2.59.0"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = {"conn_type": "ray", "host": "127.0.0.1", "port": server.server_address[1]}
    monkeypatch.setenv("AIRFLOW_CONN_RAY_OTHER_VERSION", json.dumps(conn))
    try:
        yield _Dashboard
    finally:
        server.shutdown()
        server.server_close()


def _operator() -> RayTuneOperator:
    return RayTuneOperator(
        task_id="tune",
        trainable="pkg.mod:train",
        storage_path="s3://bucket/experiments",
        metric="loss",
        mode="min",
        param_space={"x": {"choice": [1, 2]}},
        ray_conn_id="ray_other_version",
    )


def _context() -> dict:
    ti = SimpleNamespace(dag_id="dag", task_id="tune", map_index=-1, try_number=1)
    return {"ti": ti, "run_id": "manual__version-check"}


def test_the_operator_refuses_a_cluster_of_another_ray_version_before_submitting(dashboard):
    here = version("ray")
    assert here == "2.60.0"
    with mock.patch("airflow_tune.storage.read_json_or_none", return_value=None):  # no finished experiment
        with pytest.raises(RayConnectionError) as caught:
            _operator().execute(_context())  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"runs Ray 2.59.0, but this Airflow side runs Ray {here}" in message
    assert "nothing was submitted" in message
    assert ("GET", "/api/version") in dashboard.seen
    assert not [r for r in dashboard.seen if r[0] != "GET"], dashboard.seen


def test_the_hook_reads_the_version_and_accepts_its_own(dashboard):
    dashboard.ray_version = version("ray")
    hook = RayHook(ray_conn_id="ray_other_version")
    assert hook.get_ray_version() == hook.check_ray_version() == version("ray")


def test_a_dashboard_that_does_not_say_its_ray_version_is_refused_clearly(dashboard):
    dashboard.ray_version = None
    with pytest.raises(RayConnectionError, match="not as a Ray dashboard does"):
        RayHook(ray_conn_id="ray_other_version").check_ray_version()
