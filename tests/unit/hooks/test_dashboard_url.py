"""The ``ray`` connection's extra ``dashboard_url``: the dashboard as a browser opens it, for the Ray Job link, the
XCom's ``dashboard_url`` and the Experiment view, while the API calls keep going to the host. Pure logic."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from airflow_tune.exceptions import RayConnectionError
from airflow_tune.hooks.connection import BROWSER_URL_OPTION, RayEndpoint, parse_browser_url
from airflow_tune.hooks.ray import RayHook

TOKEN = "s3cr3t-t0ken-value"
HOST = "http://ray-head:8265"


def _conn(host=HOST, password=None):
    return SimpleNamespace(host=host, port=None, schema=None, password=password)


def test_the_extra_is_named_dashboard_url():
    assert BROWSER_URL_OPTION == "dashboard_url"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("  http://127.0.0.1:8265/  ", "http://127.0.0.1:8265"),
        ("HTTPS://ray.example.com", "https://ray.example.com"),
        ("https://ray.example.com/ray/", "https://ray.example.com/ray"),
        ("https://ray.example.com:8443/proxy/ray", "https://ray.example.com:8443/proxy/ray"),
        ("http://[::1]:8265", "http://[::1]:8265"),
        ("https://xn--ry-via.example.com", "https://xn--ry-via.example.com"),
        (None, None),
        ("", None),
        ("   ", None),
    ],
)
def test_accepted_forms_and_their_canonical_form(value, expected):
    assert parse_browser_url(value, TOKEN) == expected


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("ray-head:8265", "not an http(s) URL"),
        ("127.0.0.1", "not an http(s) URL"),
        ("ftp://ray.example.com", "not an http(s) URL"),
        ("javascript:alert(1)", "not an http(s) URL"),
        ("http:ray.example.com", "not an http(s) URL"),
        ("http://", "has no host"),
        ("http://:8265", "has no host"),
        ("http://ray.example.com:99999", "not a valid URL"),
        ("http://[::1", "not a valid URL"),
        ("http://ray.example.com/?next=evil", "query or a fragment"),
        ("http://ray.example.com/#/jobs", "query or a fragment"),
        ("http://ray.example.com/a/../b", "'..' path segment"),
        ("http://ray.example.com/./ray", "'..' path segment"),
        ("http://ray.example.com//evil.example.com", "empty"),
        ("http://ray.example.com/%2e%2e/x", "%-escape"),
        ("http://evil.example.com\\@ray.example.com", "backslash"),
        ("http://ray.example.com/a b", "spaces"),
        ("http://ray.example.com/\tx", "spaces"),
        ("http://räy.example.com", "non-ASCII"),
    ],
)
def test_refused_forms_name_the_extra_the_value_and_the_fix(value, words):
    with pytest.raises(RayConnectionError) as info:
        parse_browser_url(value)
    text = str(info.value)
    assert "extra 'dashboard_url'" in text and words in text, text
    assert repr(value.strip()) in text or "//***@" in text, "the refused value is shown, any user:password@ masked"
    assert "e.g. http://127.0.0.1:8265" in text and "leave it empty" in text, "the fix is given"


@pytest.mark.parametrize("value", [f"http://user:{TOKEN}@ray.example.com", f"http://{TOKEN}@ray.example.com"])
def test_credentials_are_refused_without_echoing_them(value):
    with pytest.raises(RayConnectionError, match="holds credentials") as info:
        parse_browser_url(value)
    assert TOKEN not in str(info.value) and "'http://***@ray.example.com'" in str(info.value)


@pytest.mark.parametrize(
    "value", [f"https://ray.example.com/{TOKEN}", f"https://{TOKEN}.example.com", f"http://x/?t={TOKEN}"]
)
def test_the_connections_token_anywhere_in_it_is_refused_without_echoing_it(value):
    with pytest.raises(RayConnectionError, match="holds the connection's token") as info:
        parse_browser_url(value, TOKEN)
    assert TOKEN not in str(info.value)


@pytest.mark.parametrize("value", [8265, ["http://127.0.0.1:8265"], {"url": "http://127.0.0.1:8265"}, True])
def test_a_value_that_is_not_text_is_refused(value):
    with pytest.raises(RayConnectionError, match="not a URL"):
        parse_browser_url(value)


@pytest.mark.parametrize("key", ["dashboard_url", "extra__ray__dashboard_url"])
def test_the_endpoint_keeps_the_host_for_the_api_and_the_extra_for_links(key):
    endpoint = RayEndpoint.from_connection(_conn(password=TOKEN), {key: "http://127.0.0.1:8265/"})
    assert endpoint.url == HOST
    assert endpoint.dashboard_url == "http://127.0.0.1:8265"
    assert "http://127.0.0.1:8265" in repr(endpoint) and TOKEN not in repr(endpoint)


@pytest.mark.parametrize("extra", [{}, {"dashboard_url": ""}, {"dashboard_url": None}])
def test_without_the_extra_links_use_the_host(extra):
    endpoint = RayEndpoint.from_connection(_conn(), extra)
    assert endpoint.url == endpoint.dashboard_url == HOST


def test_a_bad_extra_fails_the_connection_naming_it():
    with pytest.raises(RayConnectionError, match="extra 'dashboard_url' = 'ray-head'"):
        RayEndpoint.from_connection(_conn(), {"dashboard_url": "ray-head"})


def test_the_hook_links_to_the_extra_and_calls_the_api_at_the_host(monkeypatch, caplog):
    conn = {
        "conn_type": "ray",
        "host": HOST,
        "password": TOKEN,
        "extra": {"dashboard_url": "https://ray.example.com/ray"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_RAY_BROWSER", json.dumps(conn))
    hook = RayHook(ray_conn_id="ray_browser")
    assert hook.dashboard_url == "https://ray.example.com/ray"
    assert hook.job_url("dag:task+1") == "https://ray.example.com/ray/#/jobs/dag:task+1"
    assert hook.endpoint.url == HOST and hook.get_conn().address == HOST
    assert TOKEN not in hook.job_url("j") + hook.dashboard_url


def test_persisting_the_link_says_the_page_in_the_task_log(caplog):
    from airflow_tune.links.ray import RayJobLink

    pushed: dict[str, str] = {}
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.__setitem__(key, value))
    with caplog.at_level(logging.INFO):
        RayJobLink.persist({"ti": ti}, job_url="https://ray.example.com/ray/#/jobs/j1")
    assert pushed == {RayJobLink.key: "https://ray.example.com/ray/#/jobs/j1"}
    assert "Ray Job page: https://ray.example.com/ray/#/jobs/j1" in caplog.text


def test_the_connection_form_shows_the_extra_with_a_placeholder_and_help(monkeypatch):
    import sys
    import types

    from tests.support.airflow_compat import connection_form

    field = connection_form("ray_tune")["extra_fields"]["dashboard_url"]
    assert field["schema"]["title"] == "Dashboard URL (browser)"
    assert field["schema"]["examples"] == ["http://127.0.0.1:8265"]  # the UI's placeholder and proposal
    assert "as a browser opens it" in field["description"] and "API calls still go to the host" in field["description"]
    # Before Airflow 3.2 the form comes from the hook's wtforms widgets (3.1's API server mocks wtforms, as here):
    # the same label, and the help text, which names the example.
    fake = types.ModuleType("wtforms")
    fake.StringField = lambda label, description="": SimpleNamespace(label=label, description=description)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wtforms", fake)
    widget = RayHook.get_connection_form_widgets()["dashboard_url"]
    assert widget.label == "Dashboard URL (browser)" and "e.g. http://127.0.0.1:8265" in widget.description
