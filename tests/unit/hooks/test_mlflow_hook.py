"""MLflowHook logic that needs no server: the tracking URI and browser URL of a connection, the credentials' forms,
and that the client's credentials live only while its block runs."""

from __future__ import annotations

import json
import os

import pytest

from airflow_tune.exceptions import MLflowError
from airflow_tune.hooks.mlflow import MLflowHook, tracking_uri_of

SECRET = "mlflow-s3cr3t"


@pytest.mark.parametrize(
    ("host", "port", "schema", "expected"),
    [
        ("http://127.0.0.1:5000", None, None, "http://127.0.0.1:5000"),
        ("http://mlflow:5000/", 9999, None, "http://mlflow:5000"),
        ("https://ml.example.com/mlflow/", None, None, "https://ml.example.com/mlflow"),
        ("mlflow", 5000, None, "http://mlflow:5000"),
        ("mlflow", 443, "https", "https://mlflow:443"),
        ("https://ml.example.com", 8443, None, "https://ml.example.com:8443"),
    ],
)
def test_the_tracking_uri_of_a_connection(host, port, schema, expected):
    assert tracking_uri_of(host, port, schema, conn_id="c") == expected


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("", "has no host"),
        (None, "has no host"),
        ("ftp://mlflow", "http(s) tracking server URL"),
        ("file:///tmp/mlruns", "http(s) tracking server URL"),
        ("http://user:pw@mlflow:5000", "move them to the login and password"),
    ],
)
def test_a_connection_without_a_usable_server_url_is_refused_naming_it(host, says):
    with pytest.raises(MLflowError, match="'c'") as err:
        tracking_uri_of(host, conn_id="c")
    assert says in str(err.value)
    assert "pw@" not in str(err.value)


def _set_conn(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "http", **fields}))


def test_basic_auth_and_token_credentials_are_set_only_inside_the_client_block(monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    _set_conn(monkeypatch, "ml_basic", host="http://127.0.0.1:5999", login="alice", password=SECRET)
    _set_conn(monkeypatch, "ml_token", host="127.0.0.1", port=5999, password=SECRET, extra={"auth": "token"})
    basic, token = MLflowHook("ml_basic"), MLflowHook("ml_token")
    assert basic.tracking_uri == token.tracking_uri == "http://127.0.0.1:5999"
    with basic.client() as client:
        assert client.tracking_uri == "http://127.0.0.1:5999"
        assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
        assert os.environ["MLFLOW_TRACKING_PASSWORD"] == SECRET
        assert "MLFLOW_TRACKING_TOKEN" not in os.environ
    assert "MLFLOW_TRACKING_PASSWORD" not in os.environ
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "the-workers-own")
    with token.client():
        assert os.environ["MLFLOW_TRACKING_TOKEN"] == SECRET
        assert "MLFLOW_TRACKING_USERNAME" not in os.environ
    assert os.environ["MLFLOW_TRACKING_TOKEN"] == "the-workers-own"
    assert SECRET not in repr(basic)


def test_links_go_to_the_browser_url_when_the_connection_names_one(monkeypatch):
    _set_conn(monkeypatch, "ml_ui", host="http://mlflow.internal:5000", extra={"ui_url": "https://ml.example.com/"})
    hook = MLflowHook("ml_ui")
    assert hook.tracking_uri == "http://mlflow.internal:5000"
    assert hook.run_url("7", "abc") == "https://ml.example.com/#/experiments/7/runs/abc"
    assert hook.model_version_url("digits model", 3) == "https://ml.example.com/#/models/digits%20model/versions/3"
    _set_conn(monkeypatch, "ml_plain", host="http://127.0.0.1:5000")
    assert MLflowHook("ml_plain").experiment_url("1") == "http://127.0.0.1:5000/#/experiments/1"
