"""The Experiment view's links come from the deployment: every MLflow link's base is the MLflow connection's
(``mlflow_default``: its extra ``ui_url``, else its host), the experiment's files supply only ids (an experiment id is
a whole number, a run id 32 hex digits, each URL-quoted), and no link carries userinfo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_tune.plugins.experiment_bounds import safe_link, tracking_links
from airflow_tune.plugins.experiment_files import reduce_tracking
from tests.support.experiment_files import make_experiment
from tests.unit.plugins.test_experiment_view import OWNER, _facts, _uri, _view
from tests.unit.plugins.test_experiment_view import api as api  # the view's app with Airflow's real auth (a fixture)

#: The deployment's MLflow server (the plugin reads the mlflow_default connection: experiment_app.mlflow_server).
SERVER = {"conn_id": "mlflow_default", "tracking_uri": "http://mlflow:5000", "ui_url": "https://mlflow.example.com"}
RUN, PARENT = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
EXPERIMENT = "https://mlflow.example.com/#/experiments/7"


def _tracking(**kw: object) -> dict:
    raw = {
        "tracking_uri": "http://mlflow:5000",
        "experiment_id": "7",
        "parent_run_id": PARENT,
        "runs": {"t0": RUN},
        **kw,
    }
    return reduce_tracking(raw, "result.json", [])  # type: ignore[return-value]


def test_every_link_is_built_on_the_connections_browser_url_never_on_one_a_file_names():
    links = tracking_links(_tracking(ui_url="https://evil.example"), SERVER)
    assert links is not None
    assert links["experiment_url"] == EXPERIMENT
    assert links["parent_run_url"] == f"{EXPERIMENT}/runs/{PARENT}"
    assert links["runs"] == {"t0": f"{EXPERIMENT}/runs/{RUN}"}
    assert "evil" not in json.dumps(links)


@pytest.mark.parametrize("named", ["https://evil.example", "https://evil.example/mlflow", "http://mlflow:5001", None])
def test_a_file_that_names_another_tracking_server_gets_no_links(named):
    assert tracking_links(_tracking(tracking_uri=named), SERVER) is None
    assert tracking_links(_tracking(tracking_uri="http://mlflow:5000/"), SERVER) is not None  # the same server


def test_without_the_deployments_server_there_are_no_links():
    assert tracking_links(_tracking(ui_url="https://mlflow.example.com"), None) is None


@pytest.mark.parametrize("experiment_id", ["7abc", "../7", "7/runs/x", "-1", " 7", "7\n", "1" * 21, "", "%37", "٧"])
def test_an_experiment_id_is_a_whole_number(experiment_id):
    assert tracking_links(_tracking(experiment_id=experiment_id), SERVER) is None


@pytest.mark.parametrize(
    "run_id",
    [
        "run-1",
        "parent/1",
        "../../#/admin",
        RUN.upper(),  # MLflow writes lowercase hex
        RUN + "0",
        RUN[:-1],
        f"{RUN[:-1]}g",
        "https://evil.example",
        "%30" * 16,
    ],
)
def test_a_run_id_is_32_hex_digits_else_its_run_is_not_linked(run_id):
    links = tracking_links(_tracking(parent_run_id=run_id, runs={"t0": run_id, "t1": RUN}), SERVER)
    assert links is not None and links["experiment_url"] == EXPERIMENT
    assert links["parent_run_url"] is None
    assert links["runs"] == {"t0": None, "t1": f"{EXPERIMENT}/runs/{RUN}"}


@pytest.mark.parametrize(
    "url",
    [
        "https://user:secret@mlflow.example.com",
        "https://mlflow.example.com@evil.example",
        "https://@mlflow.example.com",
        "http://user@ray:8265/#/jobs/x",
    ],
)
def test_a_link_with_userinfo_is_never_rendered(url):
    assert safe_link(url) is None
    assert tracking_links(_tracking(), {**SERVER, "ui_url": url}) is None


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "//evil.example",
        "https://",
        "https:///path",
        "http://h:port/",
        "http://h/a b",
        "http://h/\x07",
    ],
)
def test_a_link_is_http_to_a_host(url):
    assert safe_link(url) is None


def test_plain_links_pass_as_they_are():
    assert safe_link("http://ray:8265/#/jobs/live-1") == "http://ray:8265/#/jobs/live-1"
    assert safe_link(EXPERIMENT) == EXPERIMENT


@pytest.mark.parametrize(
    ("connection", "expected"),
    [
        ({"host": "http://mlflow:5000", "extra": {"ui_url": "https://mlflow.example.com/"}}, SERVER),
        ({"host": "mlflow", "port": 5000}, {**SERVER, "ui_url": "http://mlflow:5000"}),  # no ui_url: the host
        ({"host": "http://user:pw@mlflow:5000"}, None),  # credentials belong in login/password: refused
        ({"host": "http://mlflow:5000", "extra": {"ui_url": "https://u:p@mlflow.example.com"}}, None),
        (None, None),  # no connection
    ],
)
def test_the_deployments_server_is_the_mlflow_connection(monkeypatch, connection, expected):
    from airflow_tune.plugins.experiment_app import mlflow_server

    if connection is None:
        assert mlflow_server("aft_no_such_connection") is None
        return
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "http", **connection}))
    assert mlflow_server() == expected


# -- through the view's endpoint (the real app and auth, files the engine's code wrote) ---------------------------
def _track(tmp_path, name: str, tracking: dict[str, Any] | None, file: str = "result.json") -> None:
    from airflow_tune.common import storage
    from airflow_tune.common.contract import manifest_uri

    uri = manifest_uri(_uri(tmp_path, name), file)
    doc = storage.read_json_or_none(uri)
    assert doc is not None
    storage.write_json(uri, {**doc, "mlflow": tracking})


def _run_id(i: int) -> str:
    return f"{i:032x}"


def test_a_tracked_experiment_links_its_mlflow_experiment_parent_run_and_trial_runs(api, tmp_path):
    made = make_experiment(str(tmp_path), "tracked", 3, owner=OWNER)
    runs = {t.trial_id: _run_id(i) for i, t in enumerate(made.trials)}
    tracking = {
        "tracking_uri": "http://mlflow:5000",
        "ui_url": "https://evil.example",  # storage names a browser URL: never a link's base
        "experiment_id": "7",
        "parent_run_id": PARENT,
        "runs": runs,
        "errors": 2,
        "last_error": "ConnectionError: refused",
    }
    _track(tmp_path, "tracked", tracking)
    facts = _facts(experiment_uri=_uri(tmp_path, "tracked"))
    facts.mlflow_server = SERVER
    view = _view(api, facts)
    experiment = "https://mlflow.example.com/#/experiments/7"
    assert view["mlflow"] == {
        "experiment_url": experiment,
        "parent_run_url": f"{experiment}/runs/{PARENT}",
        "errors": 2,
        "last_error": "ConnectionError: refused",
    }
    assert {r["trial_id"]: r["mlflow_url"] for r in view["table"]["rows"]} == {
        t: f"{experiment}/runs/{r}" for t, r in runs.items()
    }
    assert "evil.example" not in json.dumps(view)
    # A connection without a browser URL links its host; while running, progress.json's runs are linked.
    make_experiment(str(tmp_path), "live", 2, finished=False, running=1, owner=OWNER)
    _track(tmp_path, "live", {**tracking, "runs": {"exp_00001": _run_id(1)}}, "progress.json")
    facts = _facts(state="running", experiment_uri=_uri(tmp_path, "live"))
    facts.mlflow_server = {**SERVER, "ui_url": "http://mlflow:5000"}
    view = _view(api, facts)
    assert view["mlflow"]["experiment_url"] == "http://mlflow:5000/#/experiments/7"
    assert [r["mlflow_url"] for r in view["table"]["rows"] if r["trial_id"] == "exp_00001"] == [
        f"http://mlflow:5000/#/experiments/7/runs/{_run_id(1)}"
    ]


@pytest.mark.parametrize(
    "named",
    [
        {"tracking_uri": "https://evil.example"},
        {"tracking_uri": "https://evil.example", "ui_url": "https://evil.example"},
        {"ui_url": "https://evil.example", "experiment_id": "7/../../x"},
        {"tracking_uri": "https://user:pw@evil.example"},
        {"tracking_uri": "javascript:alert(1)"},
        {"tracking_uri": 5},
    ],
)
def test_a_storage_file_naming_another_server_or_a_malformed_id_yields_no_link_to_it(api, tmp_path, named):
    make_experiment(str(tmp_path), "hostile", 2, owner=OWNER)
    tracking = {"tracking_uri": "http://mlflow:5000", "experiment_id": "1", "parent_run_id": PARENT, **named}
    _track(tmp_path, "hostile", {**tracking, "runs": {"exp_00000": _run_id(0)}})
    facts = _facts(experiment_uri=_uri(tmp_path, "hostile"))
    facts.mlflow_server = SERVER
    view = _view(api, facts)
    assert view["state"] == "experiment"
    assert view["mlflow"] is None and all(r["mlflow_url"] is None for r in view["table"]["rows"])
    assert "evil.example" not in json.dumps({k: v for k, v in view.items() if k != "problems"})
    assert any("No MLflow links" in p and "mlflow_default" in p for p in view["problems"]), view["problems"]


def test_without_the_deployments_mlflow_server_a_tracked_experiment_has_no_links(api, tmp_path):
    make_experiment(str(tmp_path), "unlinked", 2, owner=OWNER)
    _track(
        tmp_path,
        "unlinked",
        {"tracking_uri": "http://mlflow:5000", "ui_url": "http://mlflow:5000", "experiment_id": "1"},
    )
    view = _view(api, _facts(experiment_uri=_uri(tmp_path, "unlinked")))
    assert view["mlflow"] is None and all(r["mlflow_url"] is None for r in view["table"]["rows"])


def test_an_untracked_experiment_and_a_malformed_mlflow_entry_show_no_links(api, tmp_path):
    make_experiment(str(tmp_path), "plain", 2, owner=OWNER)
    view = _view(api, _facts(experiment_uri=_uri(tmp_path, "plain")))
    assert view["mlflow"] is None
    _track(tmp_path, "plain", ["not", "an", "object"])  # type: ignore[arg-type]
    view = _view(api, _facts(experiment_uri=_uri(tmp_path, "plain")))
    assert view["mlflow"] is None and any("mlflow is a list" in p for p in view["problems"]), view["problems"]


def test_the_ray_job_link_is_the_ray_connections_dashboard_with_the_xcoms_job_id_only(monkeypatch):
    from airflow_tune.plugins.experiment_app import ray_job_link

    conn = {
        "conn_type": "ray_tune",
        "host": "ray-head",
        "port": 8265,
        "extra": {"dashboard_url": "https://ray.example"},
    }
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", json.dumps(conn))
    assert ray_job_link("exp__tune__manual-1") == "https://ray.example/#/jobs/exp__tune__manual-1"
    # An edited XCom may name any URL or id: only an id reaches the link, on the deployment's dashboard.
    for forged in ("https://evil.example/#/jobs/x", "javascript:alert(1)", "../../x", "", None, 7, "a" * 400):
        assert ray_job_link(forged) is None, forged
    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT")
    assert ray_job_link("exp-1") is None  # no ray_default connection: no link
