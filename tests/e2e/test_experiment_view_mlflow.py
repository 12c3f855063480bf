"""The Experiment view's MLflow links in a real browser (Chromium through Playwright), without Airflow: the page's
own HTML and script, served as the plugin serves them, draw the view JSON the server built
(:func:`~airflow_tune.plugins.experiment_shape.build_view`, from files the engine's functions wrote). The links
are anchors on the deployment's MLflow server (the connection's, never a URL the files name) with the files' ids;
every text, a hostile one too, stays text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.plugins import experiment_shape
from airflow_tune.plugins.experiment_shape import TaskFacts
from tests.e2e import browser
from tests.support.experiment_files import make_experiment, owner_record

STATIC = Path(experiment_shape.__file__).resolve().parent / "static"
BASE = "http://view.test/airflow-tune/"
HOSTILE = '<img src=x onerror="window.pwned=1">'
#: The deployment's MLflow server, as the plugin reads it from the mlflow_default connection.
SERVER = {"conn_id": "mlflow_default", "tracking_uri": "http://mlflow:5000", "ui_url": "http://mlflow:5000"}
PARENT = "fedcba9876543210fedcba9876543210"


def _view(tmp_path: Path) -> dict[str, Any]:
    from airflow_tune.common import storage
    from airflow_tune.common.contract import manifest_uri

    made = make_experiment(str(tmp_path), "tracked", 3, owner=owner_record("d", "tune"))
    uri = f"{tmp_path}/tracked"
    result = storage.read_json_or_none(manifest_uri(uri, "result.json"))
    assert result is not None
    runs = {t.trial_id: f"{i:032x}" for i, t in enumerate(made.trials)}
    tracking = {
        "tracking_uri": "http://mlflow:5000",
        "ui_url": "https://evil.example",  # a browser URL in storage: never a link's base
        "experiment_id": "7",
        "parent_run_id": PARENT,
        "runs": runs,
        "errors": 1,
        "last_error": HOSTILE,
    }
    storage.write_json(manifest_uri(uri, "result.json"), {**result, "mlflow": tracking})
    facts = TaskFacts(dag_id="d", run_id="r", task_id="tune", map_index=-1, found=True, is_tune=True, state="success")
    facts.experiment_uri = uri
    facts.mlflow_server = SERVER
    return experiment_shape.build_view(facts)


def test_the_view_links_the_mlflow_experiment_parent_run_and_each_trials_run(tmp_path):
    why = browser.unavailable()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    view = _view(tmp_path)
    assert view["state"] == "experiment" and view["mlflow"]["experiment_url"]
    files = {
        "experiment": ((STATIC / "experiment.html").read_bytes(), "text/html"),
        "static/experiment.js": ((STATIC / "experiment.js").read_bytes(), "application/javascript"),
        "static/uPlot.iife.min.js": ((STATIC / "uPlot.iife.min.js").read_bytes(), "application/javascript"),
        "static/uPlot.min.css": ((STATIC / "uPlot.min.css").read_bytes(), "text/css"),
        "experiment/data": (json.dumps({**view, "refresh_s": None}).encode(), "application/json"),
    }

    def serve(route: Any) -> None:
        path = route.request.url[len(BASE) :].split("?", 1)[0]
        body, kind = files.get(path, (b"", "text/plain"))
        route.fulfill(status=200 if path in files else 404, body=body, content_type=kind)

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=browser.CHROMIUM, args=browser.ARGS)
        try:
            page = chromium.new_page()
            page.route(f"{BASE}**", serve)
            page.goto(f"{BASE}experiment?dag_id=d&run_id=r&task_id=tune")
            page.locator("body[data-state=ready]").wait_for(timeout=30_000)
            header = page.locator("#mlflow a")
            assert [header.nth(i).get_attribute("href") for i in range(header.count())] == [
                "http://mlflow:5000/#/experiments/7",
                f"http://mlflow:5000/#/experiments/7/runs/{PARENT}",
            ]
            hrefs = page.evaluate("[...document.querySelectorAll('a')].map(a => a.href)")
            assert hrefs and not [h for h in hrefs if "evil.example" in h], hrefs
            assert HOSTILE in page.locator("#mlflow").inner_text()  # the last error, as text
            assert page.evaluate("window.pwned") is None and page.locator("#mlflow img").count() == 0
            rows = page.locator("#trials tbody tr")
            links = {
                rows.nth(i).get_attribute("data-trial-id"): rows.nth(i).locator("td.mlflow a").get_attribute("href")
                for i in range(rows.count())
            }
            expected = {r["trial_id"]: r["mlflow_url"] for r in view["table"]["rows"]}
            assert links == expected and all(
                u.startswith("http://mlflow:5000/#/experiments/7/runs/") for u in links.values()
            )
            assert page.locator("#trials thead th", has_text="MLflow").count() == 1
        finally:
            chromium.close()
