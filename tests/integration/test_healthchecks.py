"""Every ``python -c`` healthcheck of docker/docker-compose.yaml, as compose resolves it, run here: each fails with its
service absent (its ports free) and passes against the real service, and the ones that read an answer fail on an
unhealthy one. The compose ports are fixed (52365, 8265, 8080, 8974, 5000 for S3 and for MLflow) and the local
stack's are not, so each port in the command is replaced by the live service's; the test checks each replaced port
occurs in the command.

Real services: a Ray head of the module's own (its dashboard agent and dashboard; a worker's check asks the same
agent endpoint every node serves) and the session stack's moto server; Airflow's scheduler health server (Airflow's
own ``HealthServer`` handler on the stack's migrated database, with a live scheduler job row, then without one); for
the API server an HTTP server answering ``/api/v2/monitor/health`` with Airflow's own ``get_airflow_health()`` on that
database, in Airflow's response model (a real API server costs ~20 s more here and answers from the same function).
The MLflow check runs against a real MLflow server in tests/integration/test_mlflow.py (the stack that has one).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.unit.local.test_compose import ENV_EXAMPLE, compose_config

#: The port each compose healthcheck asks, by service.
PORTS = {
    "ray-head": (52365, 8265),
    "ray-worker-1": (52365,),
    "ray-worker-2": (52365,),
    "airflow-apiserver": (8080,),
    "airflow-scheduler": (8974,),
    "s3": (5000,),
    "mlflow": (5000,),
}


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict[str, str]:
    """The Python source of every ``CMD python -c`` healthcheck, by service."""
    env = tmp_path_factory.mktemp("healthchecks") / "env"
    shutil.copy(ENV_EXAMPLE, env)
    services = compose_config(env)["services"]
    found, other = {}, {}
    for name, service in services.items():
        test = (service.get("healthcheck") or {}).get("test") or []
        if test[:3] == ["CMD", "python", "-c"]:
            found[name] = test[3]
        elif test:
            other[name] = test[:2]
    # The rest use the images' own tools: postgres's pg_isready (not run here), and Airflow's jobs check, which
    # tests/e2e/test_real_airflow.py runs against real Airflow components.
    assert other == {
        "postgres": ["CMD", "pg_isready"],
        "airflow-dag-processor": [
            "CMD-SHELL",
            'airflow jobs check --job-type DagProcessorJob --hostname "$${HOSTNAME}"',
        ],
        "airflow-triggerer": ["CMD-SHELL", 'airflow jobs check --job-type TriggererJob --hostname "$${HOSTNAME}"'],
    }
    assert set(found) == set(PORTS)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_check(source: str, ports: dict[int, int]) -> subprocess.CompletedProcess[str]:
    for fixed, live in ports.items():
        assert source.count(f"127.0.0.1:{fixed}/") == 1, f"the check no longer asks 127.0.0.1:{fixed}"
        source = source.replace(f"127.0.0.1:{fixed}/", f"127.0.0.1:{live}/")
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=30)


@contextmanager
def http_server(answer: Callable[[str], tuple[int, bytes]]) -> Iterator[int]:
    """A loopback HTTP server answering each GET with ``answer(path)``; yields its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(HTTPServer(("127.0.0.1", 0), Handler)) as port:
        yield port


@contextmanager
def serving(server: HTTPServer) -> Iterator[int]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _agent_listen_port(ray_pid: int) -> int:
    """The dashboard agent's HTTP port of the node ``ray start`` (``ray_pid``) runs: the local stack gives every node
    its own, on ``ray start``'s command line (the agent answers there once it is up: the checks wait for that)."""
    import psutil

    [port] = [
        a.split("=", 1)[1] for a in psutil.Process(ray_pid).cmdline() if a.startswith("--dashboard-agent-listen-port=")
    ]
    return int(port)


def test_every_check_fails_with_its_service_absent(checks):
    for name, source in checks.items():
        done = run_check(source, {p: _free_port() for p in PORTS[name]})
        assert done.returncode != 0, f"{name}'s check passed with nothing listening"


def run_until_healthy(source: str, ports: dict[int, int], timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """Run the check every second until it passes or ``timeout`` ends, as Docker does within a check's start period
    and retries: a node's dashboard agent serves HTTP some seconds after the node answers the Jobs API."""
    deadline = time.monotonic() + timeout
    while True:
        done = run_check(source, ports)
        if done.returncode == 0 or time.monotonic() > deadline:
            return done
        time.sleep(1)


@pytest.fixture(scope="module")
def ray_node() -> Iterator:
    """A Ray head of this module's own: the session's has been through the suite's faults by then (a dashboard
    paused for 30 s, killed jobs)."""
    import os
    import tempfile

    from airflow_tune.local import LocalStack
    from tests.conftest import TEST_ROOT

    local = LocalStack(
        Path(tempfile.mkdtemp(prefix="healthchecks-", dir=TEST_ROOT)),
        num_cpus=1,
        airflow_home=os.environ["AIRFLOW_HOME"],
    )
    state = local.start()
    try:
        yield state
    finally:
        local.stop()


def test_the_ray_checks_pass_on_a_real_node_and_fail_on_a_wrong_answer(checks, ray_node):
    agent = _agent_listen_port(ray_node.ray_pid)
    live = {52365: agent, 8265: ray_node.dashboard_port}
    for name in ("ray-head", "ray-worker-1", "ray-worker-2"):
        done = run_until_healthy(checks[name], {p: live[p] for p in PORTS[name]})
        assert done.returncode == 0, f"{name}: {done.stderr}"
    # Something else on the port (200 without "success", or Ray's 503) is not a healthy node.
    for status, body in ((200, b"{}"), (503, b"Local Raylet failed")):
        with http_server(lambda path, s=status, b=body: (s, b)) as port:
            for name in ("ray-head", "ray-worker-1"):
                assert run_check(checks[name], {p: port for p in PORTS[name]}).returncode != 0, (name, status)
    # The head's GCS check on its own: the real agent with a dashboard that answers without "success" fails.
    with http_server(lambda path: (200, b"{}")) as port:
        assert run_check(checks["ray-head"], {52365: agent, 8265: port}).returncode != 0


def test_the_s3_check_passes_on_motos_server(checks, stack):
    assert run_check(checks["s3"], {5000: stack.s3_port}).returncode == 0


def test_the_api_server_check_passes_on_airflows_health_answer_and_fails_on_an_unhealthy_database(checks, stack):
    from airflow.api.common.airflow_health import get_airflow_health
    from airflow.api_fastapi.core_api.datamodels.monitor import HealthInfoResponse

    def answer(path: str) -> tuple[int, bytes]:
        if path != "/api/v2/monitor/health":
            return 404, b""
        return 200, HealthInfoResponse.model_validate(get_airflow_health()).model_dump_json().encode()

    with http_server(answer) as port:
        done = run_check(checks["airflow-apiserver"], {8080: port})
        assert done.returncode == 0, done.stderr
    unhealthy = json.loads(HealthInfoResponse.model_validate(get_airflow_health()).model_dump_json())
    unhealthy["metadatabase"]["status"] = "unhealthy"
    with http_server(lambda path: (200, json.dumps(unhealthy).encode())) as port:
        assert run_check(checks["airflow-apiserver"], {8080: port}).returncode != 0


def test_the_scheduler_check_follows_airflows_own_health_server(checks, stack):
    from airflow.jobs.job import Job, JobState
    from airflow.utils.scheduler_health import HealthServer
    from airflow.utils.session import create_session

    with serving(HTTPServer(("127.0.0.1", 0), HealthServer)) as port:
        # No scheduler has heartbeaten on this host: 503, unhealthy.
        assert run_check(checks["airflow-scheduler"], {8974: port}).returncode != 0
        with create_session() as session:
            job = Job(job_type="SchedulerJob")
            job.state = JobState.RUNNING
            session.add(job)
            session.flush()
            job_id = job.id
        try:
            done = run_check(checks["airflow-scheduler"], {8974: port})
            assert done.returncode == 0, done.stderr
        finally:
            with create_session() as session:
                session.query(Job).filter(Job.id == job_id).delete()


def test_the_ports_replaced_are_the_ones_compose_gives_the_services(checks):
    text = Path(__file__).read_text()
    assert "PORTS = {" in text
    for name, source in checks.items():
        asked = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)/", source)}
        assert asked == set(PORTS[name]), name
