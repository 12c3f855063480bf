"""RayHook against the real local Ray head: connection test, submit/watch/stop, errors, async calls, shared poll."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_tune.common.contract import TERMINAL_STATUSES
from airflow_tune.exceptions import RayConnectionError, RayJobError, RayJobNotFoundError
from airflow_tune.hooks.ray import RayHook
from airflow_tune.hooks.transport import AsyncTransport, quote_id
from airflow_tune.local.stack import free_port
from tests.support.json_http import JsonHandler

CONN_ID = "ray_hook_it"


def _conn_env(conn_id: str, **fields) -> tuple[str, str]:
    return f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "ray", **fields})


def _wait_terminal(hook: RayHook, job_id: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = hook.get_job_status(job_id)
        if status in TERMINAL_STATUSES:
            return status
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not finished after {timeout}s (last status {status})")


@pytest.fixture(scope="module")
def hook(stack) -> Iterator[RayHook]:
    """A connection with a default runtime_env and metadata, to see them merged under a job's own."""
    extra = {"runtime_env": {"env_vars": {"FROM_CONN": "conn", "SHARED": "conn"}}, "metadata": {"suite": "hook-it"}}
    with pytest.MonkeyPatch.context() as mp:
        conn = {"host": "127.0.0.1", "port": stack.dashboard_port, "password": stack.auth_token, "extra": extra}
        mp.setenv(*_conn_env(CONN_ID, **conn))
        yield RayHook(ray_conn_id=CONN_ID)


@pytest.fixture(scope="module")
def hello_job(hook) -> dict:
    """One trivial job, shared by the tests that read a finished job. Its id has ':' and '+' in it."""
    run = uuid.uuid4().hex[:8]
    submission_id = f"hook-it:{run}+hello"
    returned = hook.submit_job(
        entrypoint="python -c \"import os; print('hello', os.environ['FROM_CONN'], os.environ['SHARED'])\"",
        submission_id=submission_id,
        runtime_env={"env_vars": {"SHARED": "job"}},
        metadata={"run": run, "attempt": 1},
        entrypoint_num_cpus=0.1,
    )
    assert returned == submission_id
    status = _wait_terminal(hook, submission_id)
    return {"id": submission_id, "run": run, "status": status}


def test_test_connection_ok(hook):
    ok, message = hook.test_connection()
    assert ok, message
    assert "Connected to Ray 2.60" in message and hook.dashboard_url in message


def test_a_connection_without_the_clusters_token_is_refused_naming_the_password(stack, monkeypatch):
    monkeypatch.setenv(*_conn_env("ray_no_token", host="127.0.0.1", port=stack.dashboard_port))
    ok, message = RayHook(ray_conn_id="ray_no_token").test_connection()
    assert not ok and "rejected the credentials (HTTP 401)" in message and "password" in message, message


def test_test_connection_dead_port_says_so(monkeypatch):
    port = free_port()
    monkeypatch.setenv(*_conn_env("ray_dead", host="127.0.0.1", port=port))
    ok, message = RayHook(ray_conn_id="ray_dead").test_connection()
    assert not ok
    assert f"Cannot reach the Ray dashboard at http://127.0.0.1:{port}" in message
    with pytest.raises(RayConnectionError, match="Cannot reach the Ray dashboard"):
        RayHook(ray_conn_id="ray_dead").list_jobs()


def test_trivial_job_succeeds_with_merged_runtime_env_and_metadata(hook, hello_job):
    assert hello_job["status"] == "SUCCEEDED"
    info = hook.get_job_info(hello_job["id"])
    assert info["submission_id"] == hello_job["id"]
    assert info["status"] == "SUCCEEDED" and type(info["status"]) is str
    assert info["metadata"] == {"suite": "hook-it", "run": hello_job["run"], "attempt": "1"}
    assert info["driver_exit_code"] == 0 and info["end_time"] >= info["start_time"]
    assert "runtime_env" not in info
    json.dumps(info)
    # env_vars merged key by key: the connection's FROM_CONN kept, SHARED overridden by the job.
    assert "hello conn job" in hook.get_job_logs(hello_job["id"])
    assert hook.job_url(hello_job["id"]) == f"{hook.dashboard_url}/#/jobs/{hello_job['id']}"


def test_find_jobs_by_metadata(hook, hello_job):
    found = hook.find_jobs({"run": hello_job["run"], "attempt": 1})
    assert [j["submission_id"] for j in found] == [hello_job["id"]]
    assert hook.find_jobs({"run": hello_job["run"], "attempt": 2}) == []
    assert any(j["submission_id"] == hello_job["id"] for j in hook.list_jobs())


def test_reused_submission_id_is_refused(hook, hello_job):
    with pytest.raises(RayJobError, match="already exists"):
        hook.submit_job(entrypoint="true", submission_id=hello_job["id"])


def _sleeping_job(hook: RayHook, prefix: str) -> str:
    """A job that sleeps for a minute, once it is past PENDING."""
    submission_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    hook.submit_job(
        entrypoint='python -c "import time; time.sleep(60)"', submission_id=submission_id, entrypoint_num_cpus=0.1
    )
    deadline = time.monotonic() + 60
    while hook.get_job_status(submission_id) == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.3)
    return submission_id


def test_stop_long_running_job(hook):
    submission_id = _sleeping_job(hook, "hook-it-sleep")
    assert hook.stop_job(submission_id) is True
    assert _wait_terminal(hook, submission_id, timeout=30) == "STOPPED"
    assert hook.stop_job(submission_id) is False


def test_unknown_job_is_not_found(hook):
    missing = f"no-such-job:{uuid.uuid4().hex[:6]}"
    for call in (hook.get_job_info, hook.get_job_status, hook.get_job_logs, hook.stop_job):
        with pytest.raises(RayJobNotFoundError, match="not found"):
            call(missing)
    with pytest.raises(RayJobNotFoundError, match="not found"):
        asyncio.run(RayHook(ray_conn_id=CONN_ID).async_get_job_info(missing))


def test_ray_address_env_vars_do_not_redirect_the_hook(stack, monkeypatch):
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("RAY_ADDRESS", dead)
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", dead)
    hook = RayHook()  # ray_default from the stack
    assert isinstance(hook.list_jobs(), list)
    assert hook.get_conn().address == stack.dashboard_url
    assert os.environ["RAY_ADDRESS"] == dead and os.environ["RAY_API_SERVER_ADDRESS"] == dead


def test_async_methods(hook, hello_job):
    async def main():
        ahook = RayHook(ray_conn_id=CONN_ID)
        info = await ahook.async_get_job_info(hello_job["id"])
        logs = await ahook.async_get_job_logs(hello_job["id"])
        jobs = await ahook.async_list_jobs()
        return info, logs, jobs

    info, logs, jobs = asyncio.run(main())
    sync_info = hook.get_job_info(hello_job["id"])
    assert info == sync_info
    assert "hello conn job" in logs
    assert hello_job["id"] in {j["submission_id"] for j in jobs}


def test_shared_poll_makes_one_list_request_for_many_callers(hook, hello_job, monkeypatch):
    requests: list[str] = []
    real_get_json = AsyncTransport.get_json

    async def counting_get_json(self, path, **kwargs):
        requests.append(path)
        return await real_get_json(self, path, **kwargs)

    monkeypatch.setattr(AsyncTransport, "get_json", counting_get_json)
    missing = f"no-such-job-{uuid.uuid4().hex[:6]}"

    async def main():
        # Separate hooks, as separate triggers would have.
        hooks = [RayHook(ray_conn_id=CONN_ID) for _ in range(5)]
        first = await asyncio.gather(*(h.async_job_status(hello_job["id"], max_age=30) for h in hooks))
        lists_after_first = requests.count("/api/jobs/")
        again = await hooks[0].async_job_status(hello_job["id"], max_age=30)
        unknown = await hooks[1].async_job_status(missing, max_age=30)
        return first, lists_after_first, again, unknown

    first, lists_after_first, again, unknown = asyncio.run(main())
    assert lists_after_first == 1
    assert requests.count("/api/jobs/") == 1, "a second call within max_age reuses the list"
    assert all(info is not None and info["status"] == "SUCCEEDED" for info in first)
    assert again == first[0]
    assert unknown is None
    assert requests[-1].endswith(quote_id(missing)), "a job missing from the list is asked for alone"


# -- credentials: a tiny recording server on loopback ----------------------------------------------------------------


class _Recorder(JsonHandler):
    seen: list[dict[str, str]] = []
    token = "right-token"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self._answer(401, {"error": "unauthorized"})
        elif self.path == "/api/version":
            self._answer(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
        elif self.path == "/api/jobs/":
            self._answer(200, [])
        else:
            self._answer(404, {"error": "not found"})


@pytest.fixture
def recorder() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_token_is_sent_as_bearer_header(recorder, monkeypatch):
    port = recorder.server_address[1]
    monkeypatch.setenv(*_conn_env("ray_token", host="127.0.0.1", port=port, password=_Recorder.token))
    hook = RayHook(ray_conn_id="ray_token")
    ok, message = hook.test_connection()
    assert ok, message
    assert hook.list_jobs() == []  # the provider's own REST client: no Ray on this side
    assert asyncio.run(RayHook(ray_conn_id="ray_token").async_list_jobs()) == []
    paths = [seen["path"] for seen in _Recorder.seen]
    assert "/api/version" in paths and paths.count("/api/jobs/") >= 2, paths
    assert all(seen["authorization"] == f"Bearer {_Recorder.token}" for seen in _Recorder.seen)


def test_wrong_token_is_a_clear_error_without_the_token(recorder, monkeypatch):
    port = recorder.server_address[1]
    wrong = "wrong-token-value"
    monkeypatch.setenv(*_conn_env("ray_wrong", host="127.0.0.1", port=port, password=wrong))
    ok, message = RayHook(ray_conn_id="ray_wrong").test_connection()
    assert not ok
    assert "rejected the credentials (HTTP 401)" in message and wrong not in message
    with pytest.raises(RayConnectionError, match="rejected the credentials") as sync_error:
        RayHook(ray_conn_id="ray_wrong").list_jobs()
    with pytest.raises(RayConnectionError, match="rejected the credentials") as async_error:
        asyncio.run(RayHook(ray_conn_id="ray_wrong").async_list_jobs())
    assert wrong not in str(sync_error.value) + str(async_error.value)


# -- bounded retries of idempotent calls: a dashboard that answers 503 twice, then serves -----------------------------


class _Flaky(JsonHandler):
    failures_left = 0
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).seen.append(self.path)
        if self.path == "/api/version":
            return self._answer(200, {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"})
        if type(self).failures_left > 0:
            type(self).failures_left -= 1
            return self._answer(503, {"error": "busy"})
        if self.path.startswith("/api/jobs/missing"):
            return self._answer(404, {"error": "not found"})
        if self.path == "/api/jobs/":
            return self._answer(200, [])
        job = {"submission_id": "j", "job_id": None, "status": "RUNNING", "metadata": {}, "type": "SUBMISSION"}
        return self._answer(200, {**job, "entrypoint": "python -m airflow_tune.engine"})


@pytest.fixture
def flaky(monkeypatch) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    _Flaky.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(*_conn_env("ray_flaky", host="127.0.0.1", port=server.server_address[1]))
    try:
        yield "ray_flaky"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_reads_are_retried_through_two_503s_and_a_missing_job_is_not_retried(flaky, mode):
    hook = RayHook(ray_conn_id=flaky)

    def read(job_id: str) -> dict:
        return hook.get_job_info(job_id) if mode == "sync" else asyncio.run(hook.async_get_job_info(job_id))

    _Flaky.failures_left = 2
    assert read("j")["status"] == "RUNNING"
    assert [p for p in _Flaky.seen if p.startswith("/api/jobs/j")] == ["/api/jobs/j"] * 3
    _Flaky.failures_left = 3  # more than the three tries: the third 503 is the error
    with pytest.raises(RayConnectionError, match="HTTP 503"):
        read("j")
    _Flaky.failures_left = 0
    _Flaky.seen.clear()
    with pytest.raises(RayJobNotFoundError):
        read("missing")
    assert [p for p in _Flaky.seen if p.startswith("/api/jobs/")] == ["/api/jobs/missing"]


# -- the engine package: uploaded by the provider, once per content ---------------------------------------------------


def test_the_engine_package_is_uploaded_once_per_content_and_jobs_run_from_it(hook, tmp_path, monkeypatch):
    """A copy of the engine package with content of its own (a marker file) stands for the engine: the first job
    uploads it, the second finds it by its name (its content) and uploads nothing; both run from it."""
    import shutil

    from airflow_tune.hooks import packages
    from airflow_tune.hooks.jobs_client import JobsClient

    marker = uuid.uuid4().hex
    engine = tmp_path / "airflow_tune"
    shutil.copytree(packages.engine_dir(), engine, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (engine / "MARKER").write_text(marker)
    monkeypatch.setattr(packages, "engine_dir", lambda: str(engine))
    uploads: list[str] = []
    real_upload = JobsClient.upload_package

    def counted(self, name, data):
        uploads.append(name)
        return real_upload(self, name, data)

    monkeypatch.setattr(JobsClient, "upload_package", counted)
    name, _ = packages.build_package(engine)
    assert not hook.get_conn().package_exists(name), "a new content must not be on the cluster yet"

    show_marker = (
        "import airflow_tune, pathlib; print(pathlib.Path(airflow_tune.__file__).with_name('MARKER').read_text())"
    )
    # From a neutral folder: the local head runs in this checkout, whose airflow_tune would come first on sys.path.
    entrypoint = f'cd "{tmp_path}" && python -c "{show_marker}"'
    jobs = []
    for attempt in (1, 2):
        job_id = f"hook-it-engine-{marker[:8]}-{attempt}"
        hook.submit_job(
            entrypoint=entrypoint,
            submission_id=job_id,
            runtime_env={"py_modules": [str(engine)]},
            entrypoint_num_cpus=0.1,
        )
        jobs.append(job_id)
    assert uploads == [name], "the package is uploaded once, then found by its content"
    assert hook.get_conn().package_exists(name)
    for job_id in jobs:
        assert _wait_terminal(hook, job_id) == "SUCCEEDED", hook.get_job_logs(job_id)
        assert marker in hook.get_job_logs(job_id), "the job did not import the uploaded package"
        assert hook.get_conn().get_job_info(job_id)["runtime_env"]["py_modules"] == [f"gcs://{name}"]


# -- a submission whose answer is lost: a proxy in front of the real head drops it ---------------------------------


class _DroppingProxy(BaseHTTPRequestHandler):
    """Forwards every request to the real dashboard, except the first ``POST /api/jobs/``: its connection is closed
    without an answer, after Ray took the request (``drop = "answer"``) or before it reached Ray (``"request"``)."""

    upstream = ""
    drop = "answer"
    #: The POST whose first answer (or request) is dropped.
    target = "/api/jobs/"
    posts_forwarded = 0
    dropped = 0

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        is_submit = self.command == "POST" and self.path == type(self).target
        if is_submit and not type(self).dropped and type(self).drop == "request":
            type(self).dropped += 1
            self.close_connection = True
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
        request = urllib.request.Request(self.upstream + self.path, data=body, headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                status, data, content_type = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, data, content_type = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        if is_submit:
            type(self).posts_forwarded += 1
            if not type(self).dropped:
                type(self).dropped += 1
                self.close_connection = True
                return
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _forward  # noqa: N815 - http.server's naming

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def dropping(stack, monkeypatch) -> Iterator[type[_DroppingProxy]]:
    _DroppingProxy.upstream = stack.dashboard_url
    _DroppingProxy.drop = "answer"
    _DroppingProxy.target = "/api/jobs/"
    _DroppingProxy.posts_forwarded = _DroppingProxy.dropped = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DroppingProxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    conn = {"host": "127.0.0.1", "port": server.server_address[1], "password": stack.auth_token}
    monkeypatch.setenv(*_conn_env("ray_dropping", **conn))
    try:
        yield _DroppingProxy
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("drop", ["answer", "request"])
def test_a_submission_whose_answer_is_lost_is_one_job(dropping, drop, capfd):
    """Ray's dashboard drops the answers in flight when it restarts its job module (under load): the hook looks the
    job up by its id, and sends it again only when Ray never saw it. Either way: one job, which runs."""
    dropping.drop = drop
    hook = RayHook(ray_conn_id="ray_dropping")
    submission_id = f"hook-it-lost-{drop}-{uuid.uuid4().hex[:8]}"
    returned = hook.submit_job(
        entrypoint="python -c \"print('once')\"",
        submission_id=submission_id,
        metadata={"case": drop},
        entrypoint_num_cpus=0.1,
    )
    said = "".join(capfd.readouterr())
    assert returned == submission_id
    assert dropping.dropped == 1
    assert dropping.posts_forwarded == 1, "Ray received the submission exactly once"
    assert f"The answer to submitting Ray job {submission_id} was lost" in said
    assert ("created by the submission whose answer was lost" if drop == "answer" else "submitting it again") in said
    assert [j["submission_id"] for j in hook.find_jobs({"case": drop})].count(submission_id) == 1
    assert _wait_terminal(hook, submission_id) == "SUCCEEDED"
    assert "once" in hook.get_job_logs(submission_id)


def test_a_lost_answer_under_an_id_another_job_holds_is_refused(dropping, hook, hello_job):
    """The id is taken by another job (another entrypoint): that job is not this submission's, and is left alone."""
    dropping.drop = "request"
    with pytest.raises(RayJobError, match="already exists .* is not this submission"):
        RayHook(ray_conn_id="ray_dropping").submit_job(entrypoint="python -c pass", submission_id=hello_job["id"])
    assert hook.get_job_info(hello_job["id"])["entrypoint"].startswith('python -c "import os')


def test_a_stop_whose_answer_is_lost_is_sent_again_and_the_job_stops(dropping, hook):
    """Stopping is idempotent: the hook sends it again instead of failing (Ray's second answer is True while the job
    is still stopping, False once it stopped), and the job stops."""
    submission_id = _sleeping_job(hook, "hook-it-stop-lost")
    dropping.drop, dropping.target = "answer", f"/api/jobs/{quote_id(submission_id)}/stop"
    assert RayHook(ray_conn_id="ray_dropping").stop_job(submission_id) in (True, False)
    assert (dropping.dropped, dropping.posts_forwarded) == (1, 2), "Ray took the first stop, then was asked again"
    assert _wait_terminal(hook, submission_id, timeout=30) == "STOPPED"
