"""The Experiment view's data endpoint, through the plugin's real FastAPI app and Airflow's real authentication (the
simple auth manager's JWTs, checked against a migrated sqlite database), on experiment files in a local ``file://``
storage path written by the engine's own code. Pure logic: which task instance it is comes from a fake
``task_facts`` (the database lookup runs against the real API server in tests/e2e/test_real_airflow.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_tune.plugins import experiment_bounds, experiment_files, experiment_shape
from airflow_tune.plugins.experiment_shape import TaskFacts
from tests.support.experiment_files import METRIC, make_experiment, owner_record

DAG, RUN, TASK = "retrain", "manual__2026-12-02T10:00:00+00:00", "tune"
QUERY = {"dag_id": DAG, "run_id": RUN, "task_id": TASK, "map_index": "{MAP_INDEX}"}
OWNER = owner_record(DAG, TASK)


@pytest.fixture(scope="module")
def api() -> Iterator[Any]:
    """The plugin's app as Airflow's API server mounts it (from the ``airflow.plugins`` entry point), with the real
    auth manager; the test decides which task instance the request is about."""
    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.utils.db import upgradedb
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_tune.plugins import experiment_app
    from tests.support.airflow_compat import fastapi_apps

    upgradedb()  # the auth checks read the database (teams, revoked tokens); a no-op when it is migrated
    manager = init_auth_manager()
    mounted = [a for a in fastapi_apps() if a.get("url_prefix") == "/airflow-tune"]
    assert len(mounted) == 1, "the airflow.plugins entry point did not register the view's app"
    parent = FastAPI()
    parent.mount(mounted[0]["url_prefix"], mounted[0]["app"])
    holder: dict[str, Any] = {}
    app = experiment_app.get_app()
    app.dependency_overrides[experiment_app.task_facts] = lambda: holder["facts"]

    def token(role: str | None) -> dict[str, str]:
        jwt = manager.generate_jwt(SimpleAuthManagerUser(username=f"user-{role}", role=role))
        return {"Authorization": f"Bearer {jwt}"}

    with TestClient(parent) as client:
        client.holder = holder  # type: ignore[attr-defined]
        client.viewer = token("viewer")  # type: ignore[attr-defined]
        client.nobody = token(None)  # type: ignore[attr-defined]
        yield client
    app.dependency_overrides.clear()


def _facts(**kw: Any) -> TaskFacts:
    base = {"dag_id": DAG, "run_id": RUN, "task_id": TASK, "state": "success", "operator": "RayTuneOperator"}
    return TaskFacts(**{**base, "is_tune": True, **kw})


def _get(api: Any, facts: TaskFacts, headers: dict[str, str] | None = None) -> Any:
    api.holder["facts"] = facts
    resp = api.get("/airflow-tune/experiment/data", params=QUERY, headers=api.viewer if headers is None else headers)
    return resp


def _view(api: Any, facts: TaskFacts) -> dict[str, Any]:
    resp = _get(api, facts)
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    return resp.json()


def _uri(tmp_path, name: str) -> str:
    return f"file://{tmp_path}/{name}"


# -- the states ------------------------------------------------------------------------------------------------------
def test_a_running_experiment_shows_progress_curves_and_refreshes(api, tmp_path):
    made = make_experiment(str(tmp_path), "live", 12, iterations=8, running=3, finished=False, owner=OWNER)
    view = _view(
        api,
        _facts(state="deferred", experiment_uri=_uri(tmp_path, "live"), ray_job_url="http://ray:8265/#/jobs/live-1"),
    )
    assert view["state"] == "experiment" and view["status"] == "running"
    assert view["refresh_s"] == experiment_shape.REFRESH_S
    assert view["experiment"] == "live" and view["metric"] == METRIC and view["mode"] == "max"
    assert view["counts"] == {"TERMINATED": 9, "RUNNING": 3} and view["num_trials"] == 12
    assert view["best"]["trial_id"] == made.best_id
    assert view["best_checkpoint_uri"] is None  # known when it finishes
    assert view["ray_job_url"] == "http://ray:8265/#/jobs/live-1"
    rows = view["table"]["rows"]
    values = [r["value"] for r in rows]
    assert values == sorted(values, reverse=True)  # by the metric, max first
    assert {r["trial_id"] for r in rows if r["status"] == "RUNNING"} == set(made.running)
    assert [r["trial_id"] for r in rows if r["best"]] == [made.best_id]
    assert view["table"]["columns"][:2] == ["depth", "lr"]  # the keys that differ first; opt.* are the same everywhere
    curves = {c["trial_id"]: c for c in view["curves"]}
    assert set(made.running) <= set(curves)  # running ones are plotted beside the best
    assert curves[made.best_id]["best"] and sum(c["best"] for c in view["curves"]) == 1
    assert len(curves[made.running[0]]["points"]) == 4  # half of 8 iterations so far


def test_a_finished_experiment_shows_the_result_the_promotion_and_stops_refreshing(api, tmp_path):
    made = make_experiment(str(tmp_path), "done", 6, iterations=5, errored=1, owner=OWNER)
    promotion = {
        "promoted": True,
        "version": "v1",
        "reason": "no champion yet",
        "uri": "s3://r/v1",
        "task_id": "promote",
    }
    view = _view(api, _facts(experiment_uri=_uri(tmp_path, "done"), promotion=promotion))
    assert view["status"] == "succeeded" and view["refresh_s"] is None
    assert view["counts"] == {"TERMINATED": 5, "ERROR": 1} and view["num_trials"] == 6
    assert view["best"]["trial_id"] == made.best_id == "exp_00000"
    assert view["best"]["value"] == 0.99 and view["best"]["iteration"] == 5
    assert json.loads(view["best"]["config"]) == made.trials[0].config
    assert view["best_checkpoint_uri"].endswith("/done/exp_00000/checkpoint_000002")
    assert view["promotion"] == {**promotion, "task_id": "promote"}
    rows = view["table"]["rows"]
    assert [r["trial_id"] for r in rows][-1] == made.errored[0]  # no finite metric: last
    finite = [r["value"] for r in rows[:-1]]
    assert finite == sorted(finite, reverse=True) and rows[0]["best"]
    error_row = rows[-1]
    assert error_row["status"] == "ERROR" and error_row["value"] == "NaN"
    assert error_row["error"] == f"ValueError: trial {made.errored[0]} diverged"
    assert all(r["error"] is None for r in rows[:-1])
    assert rows[0]["config"] == {"depth": "2", "lr": "0.1", "opt.m": "0.9", "opt.name": "sgd"}
    assert len(view["curves"]) == 6 and all(len(c["points"]) == 5 for c in view["curves"])


def test_a_min_mode_experiment_sorts_ascending(api, tmp_path):
    from airflow_tune.common import storage
    from airflow_tune.common.contract import RESULT_FILE, manifest_uri

    make_experiment(str(tmp_path), "loss", 5, owner=OWNER)
    uri = _uri(tmp_path, "loss")
    result = json.loads((tmp_path / "loss" / ".airflow_tune" / "result.json").read_text())
    result["mode"] = "min"
    storage.write_json(manifest_uri(uri, RESULT_FILE), result)
    values = [r["value"] for r in _view(api, _facts(experiment_uri=uri))["table"]["rows"]]
    assert values == sorted(values)


def test_a_failed_experiment_shows_why(api, tmp_path):
    make_experiment(str(tmp_path), "broken", 3, errored=3, failed=True, owner=OWNER)
    view = _view(api, _facts(state="failed", experiment_uri=_uri(tmp_path, "broken")))
    assert view["status"] == "failed" and view["refresh_s"] is None
    assert view["counts"] == {"ERROR": 3} and view["best"] is None
    assert {r["error"] for r in view["table"]["rows"]} == {f"ValueError: trial exp_{i:05d} diverged" for i in range(3)}


def test_an_interrupted_experiment_without_a_result(api, tmp_path):
    make_experiment(str(tmp_path), "cut", 4, running=2, finished=False, owner=OWNER)
    view = _view(api, _facts(state="failed", experiment_uri=_uri(tmp_path, "cut")))
    assert view["status"] == "failed" and view["refresh_s"] is None and view["counts"]["RUNNING"] == 2


def test_a_retry_running_over_a_failed_result_shows_the_new_run(api, tmp_path):
    made = make_experiment(str(tmp_path), "again", 4, errored=4, failed=True, owner=OWNER)
    # The retry restores the experiment and writes progress again, after the failed result.
    from airflow_tune.common import storage
    from airflow_tune.common.contract import PROGRESS_FILE, manifest_uri
    from airflow_tune.engine.progress import progress_snapshot

    for t in made.trials:
        t.status, t.last_result = "RUNNING", {METRIC: 0.5, "training_iteration": 1}
    storage.write_json(manifest_uri(_uri(tmp_path, "again"), PROGRESS_FILE), progress_snapshot(made.spec, made.trials))
    view = _view(api, _facts(state="deferred", experiment_uri=_uri(tmp_path, "again")))
    assert view["status"] == "running" and view["counts"] == {"RUNNING": 4}


def test_a_task_that_is_not_a_tune_task_gets_a_sentence(api):
    view = _view(api, _facts(task_id="promote", operator="PromoteCheckpointOperator", is_tune=False))
    assert view["state"] == "not_tune"
    assert view["message"] == (
        "Task promote is a PromoteCheckpointOperator task, not a RayTuneOperator task: it has no experiment to show."
    )
    assert "experiment" not in view and view["refresh_s"] is None


def test_a_tune_task_with_no_experiment_yet_gets_a_sentence_and_refreshes(api, tmp_path):
    view = _view(api, _facts(state="scheduled"))
    assert view["state"] == "no_experiment" and view["refresh_s"]
    assert view["message"] == "Task tune has not started an experiment yet (task state: scheduled)."
    # Started, deferred, but nothing written yet.
    view = _view(api, _facts(state="deferred", experiment_uri=_uri(tmp_path, "fresh")))
    assert view["state"] == "starting" and view["refresh_s"] and "fresh" in view["message"]
    # Ended before writing anything.
    view = _view(api, _facts(state="failed", experiment_uri=_uri(tmp_path, "fresh")))
    assert view["state"] == "no_experiment" and view["refresh_s"] is None
    assert view["message"] == "Task tune ended (failed) before experiment fresh wrote any progress."


def test_a_tune_task_that_left_no_record_of_its_experiment(api):
    view = _view(api, _facts(state="failed"))
    assert view["state"] == "no_experiment" and view["refresh_s"] is None
    assert view["message"].startswith("Task tune ended (failed) leaving no record of an experiment")
    view = _view(api, _facts(task_id="other", operator=None, is_tune=False))
    assert view["message"] == "Task other is not a RayTuneOperator task: it has no experiment to show."


def test_no_such_task_instance(api):
    view = _view(api, _facts(found=False))
    assert view["state"] == "not_found" and "There is no task tune" in view["message"]


def test_a_link_that_is_not_http_never_reaches_the_page(api, tmp_path):
    make_experiment(str(tmp_path), "linked", 2, owner=OWNER)
    view = _view(api, _facts(experiment_uri=_uri(tmp_path, "linked"), ray_job_url="javascript:alert(1)"))
    assert view["ray_job_url"] is None


# -- access ----------------------------------------------------------------------------------------------------------
def test_a_user_who_may_not_read_the_dag_gets_403_and_no_data(api, tmp_path):
    make_experiment(str(tmp_path), "secret", 2, owner=OWNER)
    facts = _facts(experiment_uri=_uri(tmp_path, "secret"))
    for path in ("/airflow-tune/experiment/data", "/airflow-tune/experiment"):
        api.holder["facts"] = facts
        refused = api.get(path, params=QUERY, headers=api.nobody)
        assert refused.status_code == 403, refused.text
        assert "secret" not in refused.text
        anonymous = api.get(path, params=QUERY)
        assert anonymous.status_code == 401, anonymous.text
    assert _get(api, facts).status_code == 200


def test_the_page_and_its_static_files(api):
    page = api.get("/airflow-tune/experiment", params=QUERY, headers=api.viewer)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/uPlot.iife.min.js"' in page.text and "experiment.js" in page.text
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "experiment.js"):
        assert api.get(f"/airflow-tune/static/{name}").status_code == 200, name
    assert "https://" not in page.text.replace("https://github.com", "")  # nothing from a CDN


def test_the_plugin_adds_a_task_instance_tab():
    from tests.support.airflow_compat import external_views

    ours = [v for v in external_views() if v.get("url_route") == "airflow-tune-experiment"]
    assert len(ours) == 1
    assert ours[0]["destination"] == "task_instance" and ours[0]["name"] == "Experiment"
    for placeholder in ("{DAG_ID}", "{RUN_ID}", "{TASK_ID}", "{MAP_INDEX}"):
        assert placeholder in ours[0]["href"]


def test_importing_the_plugin_imports_neither_ray_nor_boto3_nor_fastapi():
    import subprocess
    import sys

    code = (
        "import sys; import airflow_tune.plugins.experiment_view as v; "
        "print(sorted(m for m in ('ray', 'boto3', 'fastapi', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


# -- size ------------------------------------------------------------------------------------------------------------
def test_2000_trials_stay_within_the_limits(api, tmp_path):
    """The response's size does not grow with the number of trials: 20 trials vs 2,000 trials (with 20 config keys and
    300 iterations each), same limits; the 2,000-trial result.json is parsed once, then served from the cache."""
    figures = {}
    for n in (20, 2000):
        started = time.perf_counter()
        made = make_experiment(str(tmp_path), f"n{n}", n, iterations=300, errored=n // 100, config_keys=20, owner=OWNER)
        built = time.perf_counter() - started
        facts = _facts(experiment_uri=_uri(tmp_path, f"n{n}"))
        result_bytes = (tmp_path / f"n{n}" / ".airflow_tune" / "result.json").stat().st_size
        history_bytes = (tmp_path / f"n{n}" / ".airflow_tune" / "history.json").stat().st_size
        parses = experiment_files._RESULTS.parses
        times = []
        for _ in range(4):
            started = time.perf_counter()
            resp = _get(api, facts)
            times.append(time.perf_counter() - started)
            assert resp.status_code == 200
        assert experiment_files._RESULTS.parses == parses + 1  # parsed once, then cached by size and mtime
        view = resp.json()
        table = view["table"]
        assert view["num_trials"] == n and table["total"] == n
        assert table["shown"] == len(table["rows"]) == min(n, experiment_bounds.TABLE_ROWS)
        assert len(table["columns"]) <= experiment_bounds.CONFIG_COLUMNS
        assert table["hidden_columns"] == 21 - experiment_bounds.CONFIG_COLUMNS
        assert {r["trial_id"] for r in table["rows"] if r["status"] == "ERROR"} == set(made.errored[:20])
        assert len(view["curves"]) <= experiment_bounds.MAX_CURVES
        assert all(len(c["points"]) <= experiment_bounds.MAX_POINTS for c in view["curves"])
        assert view["best"]["trial_id"] == made.best_id
        figures[n] = {
            "bytes": len(resp.content),
            "first_s": times[0],
            "cached_s": min(times[1:]),
            "result_bytes": result_bytes,
            "history_bytes": history_bytes,
            "rows": table["shown"],
            "curves": len(view["curves"]),
            "built_s": built,
        }
    for n, f in figures.items():
        print(
            f"\n{n} trials x 300 iterations: response {f['bytes'] / 1024:.1f} KiB ({f['rows']} rows, {f['curves']} "
            f"curves); first load {f['first_s'] * 1000:.0f} ms (result.json {f['result_bytes'] / 1024:.0f} KiB), "
            f"cached {f['cached_s'] * 1000:.0f} ms; history.json {f['history_bytes'] / 1024:.1f} KiB; "
            f"files made in {f['built_s']:.1f} s"
        )
    assert figures[2000]["bytes"] < 256 * 1024
    assert figures[2000]["history_bytes"] < 256 * 1024
    assert figures[2000]["rows"] == experiment_bounds.TABLE_ROWS


# -- finding the experiment of a task instance (the lookup's pure parts) ---------------------------------------------
def test_the_experiment_uri_comes_from_the_result_then_the_rendered_fields_then_the_dag():
    from types import SimpleNamespace

    from airflow_tune.common.spec import experiment_name_for
    from airflow_tune.plugins.experiment_app import _experiment_uri, parse_map_index

    facts = _facts(state="deferred")
    default = experiment_name_for(DAG, TASK, RUN, -1)
    task = SimpleNamespace(storage_path="s3://b/exps", experiment_name=None)
    result = {"experiment_uri": "s3://b/exps/named"}
    assert _experiment_uri(facts, result, {"storage_path": "s3://other"}, task) == ("s3://b/exps/named", "xcom")
    # Deferred: no result yet; the rendered fields say where (a JSON-quoted render too).
    rendered = {"storage_path": '"s3://b/rendered"', "experiment_name": None}
    assert _experiment_uri(facts, None, rendered, task) == (f"s3://b/rendered/{default}", "rendered")
    rendered = {"storage_path": "s3://b/rendered", "experiment_name": "mine"}
    assert _experiment_uri(facts, None, rendered, task) == ("s3://b/rendered/mine", "rendered")
    # Rendered fields pruned: the DAG's own arguments, when they hold no template.
    assert _experiment_uri(facts, None, None, task) == (f"s3://b/exps/{default}", "dag")
    templated = SimpleNamespace(storage_path="{{ var.value.where }}", experiment_name=None)
    assert _experiment_uri(facts, None, None, templated) == (None, None)
    named_by_template = SimpleNamespace(storage_path="s3://b/exps", experiment_name="{{ params.name }}")
    assert _experiment_uri(facts, None, None, named_by_template) == (None, None)
    # A task that has not started has no experiment, whatever its arguments say.
    assert _experiment_uri(_facts(state="scheduled"), None, None, task) == (None, None)
    assert [parse_map_index(v) for v in ("{MAP_INDEX}", "3", None, "-1")] == [-1, 3, -1, -1]
