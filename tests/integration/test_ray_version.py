"""The cluster must run a Ray release of the supported range (airflow_tune.common.versions): the engine runs there
with the cluster's Ray.

A dashboard on loopback answers like a Ray dashboard of a given version: outside the range, the operator and the
hook's submit_job fail before anything is written or submitted, naming the cluster's version and the range; inside
it, whatever this side's Ray, the check passes. (The compat tier runs real jobs on Ray 2.43 and 2.50 clusters.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from types import SimpleNamespace
from unittest import mock

import pytest
from packaging.version import Version

from airflow_tune.common.versions import SUPPORTED_RAY, describe_supported_ray
from airflow_tune.exceptions import RayConnectionError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.operators.tune import RayTuneOperator
from tests.support.json_http import JsonHandler


class _Dashboard(JsonHandler):
    """Answers GET /api/version with ``ray_version``, GET /api/v0/cluster_metadata as Ray 2.43 to 2.60 do when
    ``python_version`` is set (else 404, as a dashboard without that module), and GET /api/jobs/ with no jobs;
    records every request."""

    ray_version: str | None = "2.59.0"
    python_version: str | None = None
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).seen.append(("GET", self.path))
        if self.path == "/api/v0/cluster_metadata" and self.python_version is not None:
            data = {"rayVersion": self.ray_version, "pythonVersion": self.python_version, "rayInitCluster": False}
            self._answer(200, {"result": True, "msg": "", "data": data})
        elif self.path == "/api/version":
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
    _Dashboard.python_version = None
    # The operator's storage checks (disjoint folders) are not what these tests are about: no storage here.
    monkeypatch.setattr("airflow_tune.trust.disjoint.check_experiment_folder", lambda *args, **kwargs: None)
    monkeypatch.setattr("airflow_tune.common.storage.read_bytes_or_none", lambda *args, **kwargs: None)
    monkeypatch.setattr("airflow_tune.common.storage.exists", lambda *args, **kwargs: False)
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
    ti = SimpleNamespace(dag_id="dag", task_id="tune", map_index=-1, try_number=1, xcom_push=lambda key, value: None)
    return {"ti": ti, "run_id": "manual__version-check"}


@pytest.mark.parametrize("cluster_ray", ["2.42.1", "2.61.0", "2.61.0rc1"])
def test_the_operator_refuses_a_cluster_outside_the_range_before_writing_or_submitting(dashboard, cluster_ray):
    dashboard.ray_version = cluster_ray
    with (
        mock.patch("airflow_tune.common.storage.read_json_or_none", return_value=None),  # no finished experiment
        mock.patch("airflow_tune.common.storage.write_bytes") as write_bytes,
        mock.patch("airflow_tune.common.storage.write_json") as write_json,
        pytest.raises(RayConnectionError) as caught,
    ):
        _operator().execute(_context())  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"runs Ray {cluster_ray}" in message
    assert ("older" if Version(cluster_ray) < Version(SUPPORTED_RAY[0]) else "newer") in message
    assert ">=2.43.0,<2.61" in message and "2.43.0 to 2.60.x" in message
    assert "Run a Ray release in that range on the cluster" in message
    assert "nothing was written or submitted" in message
    assert not write_bytes.called and not write_json.called
    assert ("GET", "/api/version") in dashboard.seen
    assert not [r for r in dashboard.seen if r[0] != "GET"], dashboard.seen


def test_submit_job_refuses_a_cluster_outside_the_range_before_posting(dashboard):
    dashboard.ray_version = "2.40.0"
    with pytest.raises(RayConnectionError, match=r"runs Ray 2\.40\.0.*older"):
        RayHook(ray_conn_id="ray_other_version").submit_job(entrypoint="echo hi", submission_id="nothing-posted")
    assert not [r for r in dashboard.seen if r[0] != "GET"], dashboard.seen


def test_the_connection_test_fails_on_a_cluster_outside_the_range(dashboard):
    dashboard.ray_version = "2.40.0"
    ok, message = RayHook(ray_conn_id="ray_other_version").test_connection()
    assert not ok
    assert "runs Ray 2.40.0" in message and describe_supported_ray() in message, message
    dashboard.ray_version = "2.50.1"
    ok, message = RayHook(ray_conn_id="ray_other_version").test_connection()
    assert ok and "Connected to Ray 2.50.1" in message, message


@pytest.mark.parametrize("cluster_ray", ["2.43.0", "2.50.1", "2.59.0", "2.60.0", "2.60.3"])
def test_the_hook_accepts_every_release_of_the_range_whatever_this_side_runs(dashboard, cluster_ray):
    dashboard.ray_version = cluster_ray
    hook = RayHook(ray_conn_id="ray_other_version")
    assert hook.get_ray_version() == hook.check_ray_version() == cluster_ray


def test_a_dashboard_that_does_not_say_its_ray_version_is_refused_clearly(dashboard):
    dashboard.ray_version = None
    with pytest.raises(RayConnectionError, match="not as a Ray dashboard does"):
        RayHook(ray_conn_id="ray_other_version").check_ray_version()


@pytest.mark.parametrize("cluster_python", ["3.9.18", "3.14.0"])
def test_the_operator_refuses_a_cluster_python_outside_the_range_before_writing_or_submitting(
    dashboard, cluster_python
):
    dashboard.python_version = cluster_python
    with (
        mock.patch("airflow_tune.common.storage.read_json_or_none", return_value=None),
        mock.patch("airflow_tune.common.storage.write_bytes") as write_bytes,
        mock.patch("airflow_tune.common.storage.write_json") as write_json,
        pytest.raises(RayConnectionError) as caught,
    ):
        _operator().execute(_context())  # type: ignore[arg-type]
    message = str(caught.value)
    assert f"runs Python {cluster_python}" in message and "Python 3.10 to 3.13" in message, message
    assert "nothing was written or submitted" in message
    assert not write_bytes.called and not write_json.called
    assert ("GET", "/api/v0/cluster_metadata") in dashboard.seen
    assert not [r for r in dashboard.seen if r[0] != "GET"], dashboard.seen


def test_the_hook_reads_the_cluster_python_and_the_connection_test_names_it(dashboard):
    dashboard.python_version = "3.13.1"
    hook = RayHook(ray_conn_id="ray_other_version")
    assert hook.cluster_python() is None  # no request before a check
    assert tuple(hook.check_cluster_versions()) == ("2.59.0", "3.13.1")
    assert hook.cluster_python() == "3.13.1"
    ok, message = RayHook(ray_conn_id="ray_other_version").test_connection()
    assert ok and "Connected to Ray 2.59.0 on Python 3.13.1" in message, message
    dashboard.python_version = None  # a dashboard that only answers /api/version: Ray's version, Python unknown
    assert tuple(RayHook(ray_conn_id="ray_other_version").check_cluster_versions()) == ("2.59.0", None)
