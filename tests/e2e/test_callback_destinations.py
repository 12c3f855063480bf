"""A user who may only trigger DAGs sends a conf whose ``callbacks`` names a tracking server of their own: the task
fails before a Ray job exists, naming the field, and the server hears nothing (neither the nodes' MLflow token nor any
trial's data). The control: the same server written in the DAG file is called by the cluster's MLflow logger."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import ThreadingHTTPServer

import pytest

from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag
from tests.support.json_http import JsonHandler

pytestmark = pytest.mark.usefixtures("stack")
FILE = "hostile_callbacks.py"


class _Listener(JsonHandler):
    """Records every request; answers each with MLflow's error for a bad request (which its client does not retry)."""

    seen: list[str] = []

    def _record(self) -> None:
        type(self).seen.append(f"{self.command} {self.path}")
        self._answer(400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "a test listener"})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _record  # noqa: N815 - http.server's naming


@pytest.fixture(scope="module")
def listener() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listener)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AFT_E2E_TRACKING_LISTENER", url)  # read when the DAG file is parsed
        try:
            yield url
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def _date() -> datetime:
    return datetime(2004, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.mark.timeout(120)
def test_a_tracking_server_named_by_a_conf_is_refused_before_any_job_and_hears_nothing(listener):
    _Listener.seen = []
    conf = {"callbacks": ["csv", {"name": "mlflow", "args": {"tracking_uri": listener, "experiment_name": "x"}}]}
    run = run_dag(load_dag("aft_callbacks_from_conf", FILE), conf, _date())
    assert run.state == "failed"
    [error] = run.errors("tune")
    assert isinstance(error, ValueError), error
    message = str(error)
    assert "callbacks[1].args.tracking_uri = host '127.0.0.1'" in message, message
    assert "mlflow_tracking" in message and "DAG file" in message
    assert jobs_of(experiment("aft_callbacks_from_conf", run.run_id)) == []
    assert _Listener.seen == []


@pytest.mark.timeout(300)
def test_the_same_server_written_in_the_dag_file_is_called_by_the_clusters_logger(listener):
    """The control: a logger's URL does reach the cluster, and its MLflow client calls it, when the DAG file wrote
    it; so the silence above is the refusal's. The listener refuses the call, so the job fails after it."""
    _Listener.seen = []
    dag = load_dag("aft_callbacks_written", FILE)
    [task] = dag.tasks
    assert task.callbacks[0]["args"]["tracking_uri"] == listener  # parsed after the listener started
    run = run_dag(dag, None, _date())
    assert jobs_of(experiment("aft_callbacks_written", run.run_id)) != []
    assert any("/api/2.0/mlflow/" in seen for seen in _Listener.seen), _Listener.seen
