"""RayHook and RayJobLink logic that needs no Ray cluster: URLs, credentials, runtime_env, metadata, provider info."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_tune.exceptions import (
    AirflowTuneException,
    RayConnectionError,
    RayDashboardUnavailable,
    RayJobError,
    RayJobNotFoundError,
)
from airflow_tune.hooks.connection import RayEndpoint, build_dashboard_url, merge_runtime_env
from airflow_tune.hooks.ray import RayHook
from airflow_tune.hooks.transport import job_to_dict, metadata_matches, newest_first, quote_id
from airflow_tune.hooks.transport import status_error as _status_error
from airflow_tune.hooks.transport import translate_error as _translate_error

TOKEN = "s3cr3t-t0ken-value"


def _conn(host="127.0.0.1", port=None, schema=None, password=None, extra=None):
    return SimpleNamespace(host=host, port=port, schema=schema, password=password, extra=json.dumps(extra or {}))


def _set_conn(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "ray", **fields}))


@pytest.mark.parametrize(
    ("host", "port", "schema", "expected"),
    [
        ("127.0.0.1", None, None, "http://127.0.0.1:8265"),
        ("ray-head", 9000, "https", "https://ray-head:9000"),
        ("ray-head", None, "HTTPS", "https://ray-head:8265"),
        ("ray-head:8300", None, None, "http://ray-head:8300"),
        ("::1", 8265, None, "http://[::1]:8265"),
        ("http://ray-head:8265", None, None, "http://ray-head:8265"),
        ("http://ray-head:8265/", 9999, "https", "http://ray-head:8265"),
        ("https://ray.example.com", None, None, "https://ray.example.com"),
        ("https://ray.example.com/proxy/ray/", 8443, None, "https://ray.example.com:8443/proxy/ray"),
    ],
)
def test_dashboard_url_from_host_port_schema_or_full_url(host, port, schema, expected):
    assert build_dashboard_url(host, port, schema) == expected


@pytest.mark.parametrize(
    ("host", "schema", "fragment"),
    [
        ("", None, "has no host"),
        (None, None, "has no host"),
        ("ray-head", "ftp", "use 'http' or 'https'"),
        ("ray://ray-head:10001", None, "not an http(s) URL"),
        (f"http://user:{TOKEN}@ray-head:8265", None, "holds credentials"),
    ],
)
def test_bad_addresses_say_how_to_fix(host, schema, fragment):
    with pytest.raises(RayConnectionError, match=None) as info:
        build_dashboard_url(host, None, schema)
    assert fragment in str(info.value)
    assert TOKEN not in str(info.value)


def test_token_becomes_bearer_header_and_never_shows_in_repr():
    extra = {"headers": {"X-Team": "ml", "authorization": "Basic old"}, "cookies": {"session": "c00kie"}}
    endpoint = RayEndpoint.from_connection(_conn(password=TOKEN, extra=extra), extra)
    assert endpoint.headers == {"X-Team": "ml", "Authorization": f"Bearer {TOKEN}"}
    assert endpoint.cookies == {"session": "c00kie"}
    assert TOKEN not in repr(endpoint)
    assert "c00kie" not in repr(endpoint)
    assert "Authorization" in repr(endpoint)


def test_credentials_key_differs_by_token():
    a = RayEndpoint.from_connection(_conn(password="a"), {})
    b = RayEndpoint.from_connection(_conn(password="b"), {})
    assert a.url == b.url
    assert a.credentials_key != b.credentials_key
    assert TOKEN not in RayEndpoint.from_connection(_conn(password=TOKEN), {}).credentials_key


@pytest.mark.parametrize(
    ("extra", "verify"),
    [
        ({}, True),
        ({"verify": False}, False),
        ({"verify": "false"}, False),
        ({"verify": "True"}, True),
        ({"verify": "/etc/ssl/ca.pem"}, "/etc/ssl/ca.pem"),
        ({"extra__ray__verify": "false"}, False),
    ],
)
def test_verify_extra(extra, verify):
    assert RayEndpoint.from_connection(_conn(), extra).verify == verify


def test_dict_extras_accept_json_strings_and_reject_other_values():
    extra = {"runtime_env": json.dumps({"env_vars": {"A": "1"}}), "metadata": {"team": "ml", "n": 3}}
    endpoint = RayEndpoint.from_connection(_conn(), extra)
    assert endpoint.runtime_env == {"env_vars": {"A": "1"}}
    assert endpoint.metadata == {"team": "ml", "n": "3"}
    with pytest.raises(RayConnectionError, match="'headers' must be a JSON object"):
        RayEndpoint.from_connection(_conn(), {"headers": "not json"})


def test_runtime_env_merge_keeps_defaults_and_merges_env_vars_by_key():
    default = {"env_vars": {"A": "1", "B": "2"}, "pip": ["x"], "working_dir": "s3://b/w.zip"}
    given = {"env_vars": {"B": "20", "C": "3"}, "pip": ["y"]}
    merged = merge_runtime_env(default, given)
    assert merged == {"env_vars": {"A": "1", "B": "20", "C": "3"}, "pip": ["y"], "working_dir": "s3://b/w.zip"}
    merged["env_vars"]["A"] = "changed"
    assert default["env_vars"]["A"] == "1", "the connection's default must not be mutated"
    assert merge_runtime_env(None, None) == {}
    assert merge_runtime_env({"env_vars": {"A": "1"}}, None) == {"env_vars": {"A": "1"}}


def test_metadata_filter_matches_all_pairs_as_strings():
    meta = {"experiment": "exp-1", "try": "2"}
    assert metadata_matches(meta, {"experiment": "exp-1"})
    assert metadata_matches(meta, {"experiment": "exp-1", "try": 2})
    assert not metadata_matches(meta, {"experiment": "exp-2"})
    assert not metadata_matches(meta, {"missing": "x"})
    assert not metadata_matches(None, {"experiment": "exp-1"})
    assert metadata_matches(None, {})


def test_newest_first_puts_unstarted_jobs_first():
    jobs = [{"submission_id": "old", "start_time": 1}, {"submission_id": "new", "start_time": 5}]
    jobs.append({"submission_id": "pending", "start_time": None})
    assert [j["submission_id"] for j in newest_first(jobs)] == ["pending", "new", "old"]


def test_job_to_dict_is_plain_and_leaves_runtime_env_out():
    from enum import Enum

    class Status(str, Enum):
        RUNNING = "RUNNING"

    raw = {
        "submission_id": "s",
        "status": Status.RUNNING,
        "runtime_env": {"env_vars": {"KEY": TOKEN}},
        "metadata": None,
    }
    out = job_to_dict(raw)
    assert out["status"] == "RUNNING" and type(out["status"]) is str
    assert out["metadata"] == {}
    assert "runtime_env" not in out
    json.dumps(out)
    assert job_to_dict(SimpleNamespace(**raw))["status"] == "RUNNING"


def test_submission_ids_are_quoted_for_paths():
    assert quote_id("dag:task+1/x") == "dag%3Atask%2B1%2Fx"


def test_error_translation():
    assert isinstance(_status_error(404, "no", url="u", action="read", job_id="j"), RayJobNotFoundError)
    assert "not found" in str(_status_error(404, "no", url="u", action="read", job_id="j"))
    assert isinstance(_status_error(401, "", url="u", action="read", job_id=None), RayConnectionError)
    assert "already exists" in str(
        _status_error(500, "Job with submission_id j already exists", url="u", action="s", job_id="j")
    )
    err = _translate_error(RuntimeError("Request failed with status code 404: gone."), url="u", action="a", job_id="j")
    assert isinstance(err, RayJobNotFoundError) and isinstance(err, RayJobError)
    assert isinstance(_translate_error(ConnectionError("refused"), url="u", action="a"), RayConnectionError)
    assert isinstance(_translate_error(ValueError("odd"), url="u", action="a"), AirflowTuneException)


def test_hook_init_does_no_io_and_repr_has_no_secret(monkeypatch, caplog):
    _set_conn(monkeypatch, "ray_secret", host="127.0.0.1", port=1, password=TOKEN)
    hook = RayHook(ray_conn_id="does_not_exist_anywhere")  # no lookup at init, so no error
    assert hook._endpoint is None and hook._client is None
    hook = RayHook(ray_conn_id="ray_secret")
    with caplog.at_level(logging.DEBUG):
        assert hook.dashboard_url == "http://127.0.0.1:1"
        assert hook.endpoint.headers["Authorization"] == f"Bearer {TOKEN}"
        ok, message = hook.test_connection()
    assert not ok
    assert TOKEN not in repr(hook) + repr(hook.endpoint) + message + caplog.text
    assert hook.job_url("dag:task+1") == "http://127.0.0.1:1/#/jobs/dag:task+1"


def test_ui_field_behaviour_matches_provider_info():
    behaviour = RayHook.get_ui_field_behaviour()
    assert behaviour["hidden_fields"] == ["login"]
    assert behaviour["relabeling"]["password"] == "Token"
    assert isinstance(RayHook.get_connection_form_widgets(), dict)


def test_provider_info_registers_hook_connection_type_and_link():
    from airflow_tune.get_provider_info import get_provider_info

    info = get_provider_info()
    assert info["package-name"] == "airflow-tune"
    conn_types = {c["connection-type"]: c for c in info["connection-types"]}
    assert conn_types["ray_tune"]["hook-class-name"] == "airflow_tune.hooks.ray.RayHook"
    hooks = {"integration-name": "Ray Tune", "python-modules": ["airflow_tune.hooks.ray", "airflow_tune.hooks.mlflow"]}
    assert hooks in info["hooks"]
    assert "airflow_tune.links.ray.RayJobLink" in info["extra-links"]


def test_providers_manager_sees_the_ray_tune_connection_type():
    from tests.support.airflow_compat import connection_form, task_runtime_hooks

    hook_info = task_runtime_hooks()["ray_tune"]
    assert hook_info is not None
    assert hook_info.hook_class_name == "airflow_tune.hooks.ray.RayHook"
    assert hook_info.connection_testable
    # What the UI's connection form is given (3.2+ read conn-fields; 3.1 calls the hook's form methods).
    form = connection_form("ray_tune")
    assert set(form["extra_fields"]) >= {"verify", "headers", "cookies", "runtime_env", "allowed_storage_roots"}
    assert form["standard_fields"]["login"]["hidden"] is True
    assert form["standard_fields"]["password"]["title"] == "Token"


def test_link_reads_the_url_persisted_at_submit(monkeypatch):
    from airflow_tune.links.ray import RayJobLink

    pushed = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value))
    RayJobLink.persist({"ti": ti}, job_url="http://127.0.0.1:8265/#/jobs/x")
    assert pushed == {"ray_job_url": "http://127.0.0.1:8265/#/jobs/x"}

    from airflow.sdk.execution_time import xcom

    seen = {}

    def get_value(*, ti_key, key):
        seen["key"] = key
        return pushed.get(key)

    monkeypatch.setattr(xcom.XCom, "get_value", staticmethod(get_value))
    link = RayJobLink()
    assert link.name == "Ray Job"
    assert link.xcom_key == "ray_job_url", "the API server reads the link from XCom under xcom_key"
    assert link.get_link(None, ti_key=SimpleNamespace()) == "http://127.0.0.1:8265/#/jobs/x"
    assert seen["key"] == "ray_job_url"
    pushed.clear()
    assert link.get_link(None, ti_key=SimpleNamespace()) == ""


def test_importing_hook_and_link_loads_no_heavy_modules():
    code = (
        "import sys, json\n"
        "import airflow_tune.hooks.ray, airflow_tune.links.ray\n"
        "heavy = ('ray', 'boto3', 'botocore', 'pyarrow', 'aiohttp')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# -- submitting while no job agent has registered ------------------------------------------------------------------


class _SubmitAnswers:
    """A Jobs client whose submissions fail with the given errors first, then succeed; it knows the jobs ``jobs``
    (``None`` for an id whose lookup fails with no answer)."""

    address = "http://127.0.0.1:8265"

    def __init__(self, *errors: Exception, jobs: dict | None = None) -> None:
        self.errors = list(errors)
        self.jobs = dict(jobs or {})
        self.calls = 0
        self.lookups = 0

    def submit_job(self, **fields) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.jobs[fields["submission_id"]] = {"entrypoint": fields["entrypoint"], "metadata": fields["metadata"] or {}}
        return fields["submission_id"]

    def get_job_info(self, job_id: str) -> dict:
        self.lookups += 1
        if job_id not in self.jobs:
            raise RayJobNotFoundError(f"Ray job {job_id!r} not found")
        if self.jobs[job_id] is None:
            raise RayDashboardUnavailable("Cannot reach the Ray dashboard: Connection refused")
        return self.jobs[job_id]


def _hook_with(client: _SubmitAnswers) -> RayHook:
    hook = RayHook()
    hook._endpoint = RayEndpoint.from_connection(_conn(), {})
    hook._client = client  # type: ignore[assignment]
    hook.ship_local_code = lambda env: env  # type: ignore[method-assign]
    return hook


def test_a_submission_no_job_agent_took_is_sent_again_and_any_other_failure_is_not(monkeypatch):
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda s: None)
    url = "http://127.0.0.1:8265"
    no_agent = _status_error(
        500, "No available agent to submit job, please try again later.", url=url, action="submit", job_id="j"
    )
    client = _SubmitAnswers(no_agent, no_agent)
    assert _hook_with(client).submit_job(entrypoint="true", submission_id="j", same_ray_version=False) == "j"
    assert client.calls == 3
    # Any other 5xx may hide a started job: not sent again blindly (the lost answer is settled by a lookup, below).
    other = _status_error(500, "Traceback ...\nKeyError: 'x'", url=url, action="submit", job_id="j")
    client = _SubmitAnswers(other, jobs={"j": {"entrypoint": "true", "metadata": {}}})
    assert _hook_with(client).submit_job(entrypoint="true", submission_id="j", same_ray_version=False) == "j"
    assert client.calls == 1
    # An agent that never registers: the last answer is the failure, after a bounded number of tries.
    client = _SubmitAnswers(*[no_agent] * 10)
    with pytest.raises(RayDashboardUnavailable, match="No available agent"):
        _hook_with(client).submit_job(entrypoint="true", submission_id="j", same_ray_version=False)
    assert client.calls == 4


# -- a submission whose answer was lost ----------------------------------------------------------------------------
_DROPPED = RayDashboardUnavailable(
    "Cannot reach the Ray dashboard at http://127.0.0.1:8265 to submit job 'j': ('Connection aborted.', "
    "RemoteDisconnected('Remote end closed connection without response'))"
)


def _submit(client: _SubmitAnswers, **fields) -> str:
    return _hook_with(client).submit_job(entrypoint="true", submission_id="j", same_ray_version=False, **fields)


def test_a_lost_answer_whose_job_ray_created_is_that_job_and_nothing_is_sent_again():
    client = _SubmitAnswers(_DROPPED, jobs={"j": {"entrypoint": "true", "metadata": {"run": "r1"}}})
    assert _submit(client, metadata={"run": "r1"}) == "j"
    assert (client.calls, client.lookups) == (1, 1)


def test_a_lost_answer_whose_job_ray_never_saw_is_sent_again_once():
    client = _SubmitAnswers(_DROPPED)
    assert _submit(client) == "j"
    assert (client.calls, client.lookups) == (2, 1)
    assert client.jobs["j"]["entrypoint"] == "true"


def test_a_lost_answer_then_already_exists_is_the_first_request_arriving_late():
    # Looked up too early (not there yet), sent again, and Ray says the id is taken: by the first request.
    exists = _status_error(400, "Job with submission_id j already exists.", url="u", action="submit", job_id="j")

    class LateArrival(_SubmitAnswers):
        def submit_job(self, **fields) -> str:
            if self.calls == 1:
                self.jobs["j"] = {"entrypoint": "true", "metadata": {}}
            return super().submit_job(**fields)

    client = LateArrival(_DROPPED, exists)
    assert _submit(client) == "j"
    assert (client.calls, client.lookups) == (2, 2)


def test_a_lost_answer_under_an_id_another_job_holds_is_refused_naming_the_id():
    client = _SubmitAnswers(_DROPPED, jobs={"j": {"entrypoint": "python other.py", "metadata": {}}})
    with pytest.raises(RayJobError, match="'j' already exists .* is not this submission"):
        _submit(client)
    client = _SubmitAnswers(_DROPPED, jobs={"j": {"entrypoint": "true", "metadata": {"run": "r0"}}})
    with pytest.raises(RayJobError, match="is not this submission"):
        _submit(client, metadata={"run": "r1"})
    assert client.calls == 1


def test_a_lost_answer_and_a_dashboard_that_never_answers_again_fails_saying_to_look_first(monkeypatch):
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda s: None)
    monkeypatch.setattr("airflow_tune.hooks.submission.SETTLE_SECONDS", 0.0)
    client = _SubmitAnswers(_DROPPED, jobs={"j": None})
    with pytest.raises(RayDashboardUnavailable, match="RemoteDisconnected.*look for it before submitting it again"):
        _submit(client)
    assert client.calls == 1
