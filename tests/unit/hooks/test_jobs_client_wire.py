"""The provider's own Jobs REST client on the wire, and the engine package's zip beside Ray's own packing of a folder.

The requests are checked against a stub HTTP server on 127.0.0.1 that records what it is sent and answers what it is
told to (what Ray's dashboard answers is for tests/integration/test_hook.py, against a real head; the pure logic of
packages and refusals is in tests/unit/test_no_ray_side.py).
"""

from __future__ import annotations

import io
import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_tune.exceptions import RayConnectionError, RayDashboardUnavailable, RayJobError, RayJobNotFoundError
from airflow_tune.hooks import packages
from airflow_tune.hooks.connection import RayEndpoint
from airflow_tune.hooks.jobs_client import JobsClient
from tests.unit.test_no_ray_side import _package

# -- the wire format ------------------------------------------------------------------------------------------------


class _Dashboard(BaseHTTPRequestHandler):
    """Answers each request with the next queued (status, body) and records the request."""

    answers: list[tuple[int, Any]]
    seen: list[dict[str, Any]]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body})
        status, payload = self.answers.pop(0) if self.answers else (200, {})
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def dashboard() -> Iterator[tuple[JobsClient, type[_Dashboard]]]:
    handler = type("Handler", (_Dashboard,), {"answers": [], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    endpoint = RayEndpoint(
        url=f"http://127.0.0.1:{server.server_address[1]}",
        headers={"Authorization": "Bearer t0ken", "X-Team": "ml"},
        cookies={"session": "c00kie"},
    )
    client = JobsClient(endpoint, request_timeout=5.0)
    try:
        yield client, handler
    finally:
        client.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_every_call_sends_the_connections_headers_and_cookies_to_rays_paths(dashboard):
    client, server = dashboard
    server.answers += [
        (200, {"submission_id": "exp:1/a"}),
        (200, {"submission_id": "exp:1/a", "status": "RUNNING"}),
        (200, [{"submission_id": "exp:1/a"}]),
        (200, {"stopped": True}),
        (200, {"logs": "hello\n"}),
    ]
    assert client.submit_job(entrypoint="e", submission_id="exp:1/a", runtime_env={}, metadata={"k": "v"}) == "exp:1/a"
    assert client.get_job_info("exp:1/a")["status"] == "RUNNING"
    assert client.list_jobs() == [{"submission_id": "exp:1/a"}]
    assert client.stop_job("exp:1/a") is True
    assert client.get_job_logs("exp:1/a") == "hello\n"
    calls = [(s["method"], s["path"]) for s in server.seen]
    assert calls == [
        ("POST", "/api/jobs/"),
        ("GET", "/api/jobs/exp%3A1%2Fa"),
        ("GET", "/api/jobs/"),
        ("POST", "/api/jobs/exp%3A1%2Fa/stop"),
        ("GET", "/api/jobs/exp%3A1%2Fa/logs"),
    ]
    for seen in server.seen:
        assert seen["headers"]["Authorization"] == "Bearer t0ken" and seen["headers"]["X-Team"] == "ml"
        assert seen["headers"]["Cookie"] == "session=c00kie"
    assert json.loads(server.seen[0]["body"]) == {
        "entrypoint": "e",
        "submission_id": "exp:1/a",
        "runtime_env": {},
        "metadata": {"k": "v"},
    }


@pytest.mark.parametrize(
    ("status", "body", "error", "says"),
    [
        (401, "Unauthorized", RayConnectionError, "connection's password"),
        (403, "Forbidden", RayConnectionError, "HTTP 403"),
        (404, "Job does not exist", RayJobNotFoundError, "not found"),
        (400, "Job with submission_id j already exists. Please use a different submission_id.", RayJobError, "already"),
        (
            500,
            "Traceback (most recent call last):\n  ...\nValueError: boom",
            RayDashboardUnavailable,
            "ValueError: boom",
        ),
        (400, "bad runtime_env", RayJobError, "HTTP 400"),
    ],
)
def test_error_answers_become_the_packages_exceptions(dashboard, status, body, error, says):
    client, server = dashboard
    server.answers.append((status, body))
    with pytest.raises(error, match=says) as caught:
        client.get_job_info("j")
    assert "t0ken" not in str(caught.value) and "c00kie" not in str(caught.value)


def test_an_answer_that_is_not_json_is_a_clear_error(dashboard):
    client, server = dashboard
    server.answers.append((200, "<html>a proxy's page</html>"))
    with pytest.raises(RayJobError, match="no JSON"):
        client.list_jobs()


def test_a_dead_dashboard_is_unavailable_not_a_hang():
    client = JobsClient(RayEndpoint(url="http://127.0.0.1:9"), request_timeout=2.0)
    with pytest.raises(RayDashboardUnavailable, match="Cannot reach"):
        client.list_jobs()


def test_packages_are_looked_up_then_put(dashboard):
    client, server = dashboard
    server.answers += [(404, "not found"), (200, {}), (200, {})]
    assert client.package_exists("_ray_pkg_ab.zip") is False
    client.upload_package("_ray_pkg_ab.zip", b"PK zip bytes")
    assert client.package_exists("_ray_pkg_ab.zip") is True
    calls = [(s["method"], s["path"], s["body"]) for s in server.seen]
    assert calls == [
        ("GET", "/api/packages/gcs/_ray_pkg_ab.zip", b""),
        ("PUT", "/api/packages/gcs/_ray_pkg_ab.zip", b"PK zip bytes"),
        ("GET", "/api/packages/gcs/_ray_pkg_ab.zip", b""),
    ]


def test_the_client_never_reads_ray_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:1")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:1")
    assert JobsClient(RayEndpoint(url="http://ray-head:8265"), 5.0).address == "http://ray-head:8265"


# -- the engine package ---------------------------------------------------------------------------------------------


def test_the_zip_has_rays_layout_for_a_py_modules_folder(tmp_path):
    """Ray's own packing of the same folder (``include_parent_dir``, as for py_modules): the same entries, but for
    the bytecode Ray would ship too."""
    from ray._private.runtime_env.packaging import _zip_files

    pkg = _package(tmp_path)
    _zip_files(str(pkg), [], str(tmp_path / "ray.zip"), include_gitignore=False, include_parent_dir=True)
    rays = {n for n in zipfile.ZipFile(tmp_path / "ray.zip").namelist() if "__pycache__" not in n}
    rays = {n for n in rays if not n.endswith(".pyc")}
    _, data = packages.build_package(pkg)
    assert set(zipfile.ZipFile(io.BytesIO(data)).namelist()) == rays


def test_the_engine_zip_is_the_installed_airflow_tune():
    name, data = packages.build_package(packages.engine_dir())
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "airflow_tune/engine/__main__.py" in names and "airflow_tune/__init__.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
