"""The example DAGs under the real Airflow processes: scheduler, triggerer, dag processor and API server (LocalExecutor,
sqlite) in an Airflow home of their own, against the session's Ray head and S3 endpoint.

The UI DAG is triggered through the public REST API the way the trigger form does it; a conf that breaks the
Params' JSON schema is refused there; a good conf runs the tune task deferred in the real triggerer, its XCom is read
back through the API, and the promotion's Asset event starts the deploy DAG. The Experiment view (the UI plugin) is
asked for its data while the task is deferred and once it has finished, then opened in a real browser: Chromium logs
in, opens the tune task's Experiment tab and checks the trial table and the curves.

One Airflow serves every test of this module (it takes ~40 s to start).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.e2e import browser
from tests.e2e.real_airflow import USERNAME, ApiClient, RealAirflow, wait_until

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
UI_DAG = "digits_tune_from_ui"
DEPLOY_DAG = "digits_deploy_on_promotion"
TRIGGER_CLASSPATH = "airflow_tune.triggers.tune.RayTuneTrigger"
GOOD_CONF = {
    "search_space": {"alpha": {"loguniform": [1e-5, 1e-2]}, "eta0": {"loguniform": [1e-3, 1e-1]}},
    "num_samples": 2,
    "max_steps": 2,
    "time_budget_s": 180,
    "promote": True,
}
VIEW_DATA = "/airflow-tune/experiment/data"
#: Runs of the UI DAG that reached success in this module, for the browser test.
FINISHED_RUNS: list[str] = []


@pytest.fixture(scope="module")
def prefix() -> str:
    """The S3 prefix under the stack's bucket that this test's experiments and registry live in."""
    return f"e2e-real-airflow-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def airflow(stack: Any, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAirflow]:
    env = {
        **stack.env(),
        "AIRFLOW_TUNE_STORAGE_URI": f"s3://{stack.bucket}/{prefix}/experiments",
        # The S3 registry on purpose: the example DAGs' default is MLflow's (tested with dag.test in test_cluster and
        # test_registry_mlflow); here the S3 path runs under the real scheduler, and no MLflow server is started.
        "AIRFLOW_TUNE_REGISTRY_URI": f"s3://{stack.bucket}/{prefix}/models/digits",
    }
    real = RealAirflow(tmp_path_factory.mktemp("real-airflow") / "home", REPO / "dags", env)
    try:
        try:
            real.start()
        except BaseException:
            print(real.diagnostics())
            raise
        yield real
    finally:
        left = real.stop()
        _stop_live_ray_jobs(UI_DAG)
        print("real Airflow timings: " + ", ".join(f"{k} {v:.1f}s" for k, v in real.timings.items()))
        assert not left, f"processes left after stopping Airflow: {left}"


@pytest.fixture(scope="module")
def api(airflow: RealAirflow) -> Iterator[ApiClient]:
    client = ApiClient(airflow.base_url, USERNAME, airflow.password)
    try:
        yield client
    finally:
        client.close()


def _stop_live_ray_jobs(dag_id: str) -> None:
    """A failed test must not leave its experiment running on the session's Ray head."""
    try:
        from airflow_tune.hooks.ray import RayHook

        hook = RayHook()
        for job in hook.list_jobs():
            if (job.get("metadata") or {}).get("airflow_dag_id") == dag_id and job.get("status") in (
                "PENDING",
                "RUNNING",
            ):
                hook.stop_job(job["submission_id"])
                print(f"stopped Ray job {job['submission_id']} left running by the test")
    except Exception as exc:  # best effort; the stack stops the head at the end of the session anyway
        print(f"could not stop the Ray jobs of {dag_id}: {exc}")


def _log_events(content: list[Any]) -> list[dict[str, Any]]:
    """Structured log lines of the logs API (dicts with ``event``, ``logger``...); text lines as ``{"event": s}``."""
    events = []
    for item in content:
        if isinstance(item, dict):
            events.append(item)
        elif isinstance(item, str):
            events.append({"event": item})
    return events


def _view_data(airflow: RealAirflow, api: ApiClient, run_id: str, task_id: str, **kw: Any) -> dict[str, Any]:
    """The Experiment view's data from the real API server, with the test user's token."""
    query = {"dag_id": UI_DAG, "run_id": run_id, "task_id": task_id, "map_index": "{MAP_INDEX}"}
    resp = api.http.get(f"{airflow.base_url}{VIEW_DATA}", params=query, **kw)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _experiment_file(s3_client: Any, experiment_uri: str, name: str) -> dict[str, Any]:
    bucket, _, key = experiment_uri[len("s3://") :].partition("/")
    body = s3_client.get_object(Bucket=bucket, Key=f"{key}/.airflow_tune/{name}")["Body"].read()
    return dict(json.loads(body))


def test_ui_dag_under_real_airflow(airflow: RealAirflow, api: ApiClient, stack: Any, prefix: str, s3_client) -> None:
    started = time.monotonic()
    try:
        _run_scenario(airflow, api, stack, prefix, s3_client)
    except BaseException:
        print(airflow.diagnostics())
        raise
    finally:
        print(f"real-Airflow scenario took {time.monotonic() - started:.1f}s")


def _run_scenario(airflow: RealAirflow, api: ApiClient, stack: Any, prefix: str, s3_client) -> None:
    # The dag processor has parsed both example DAGs, without import errors.
    def parsed() -> bool:
        airflow.check_alive()
        return all(api.request("GET", f"/dags/{d}").status_code == 200 for d in (UI_DAG, DEPLOY_DAG))

    wait_until(parsed, 90, "the dag processor to parse the example DAGs")
    assert api.import_errors() == []

    # 1. A conf that breaks the Params' JSON schema is refused by the API with a message naming the param.
    too_few = api.trigger(UI_DAG, {**GOOD_CONF, "num_samples": 0})
    assert too_few.status_code == 400, too_few.text
    detail = too_few.json()["detail"]
    print(f"refused num_samples=0: {detail}")
    assert "Invalid input for param num_samples" in detail and "minimum of 1" in detail, detail

    unknown_primitive = api.trigger(UI_DAG, {**GOOD_CONF, "search_space": {"alpha": {"gaussian": [0, 1]}}})
    assert unknown_primitive.status_code == 400, unknown_primitive.text
    detail = unknown_primitive.json()["detail"]
    print(f"refused an unknown primitive: {detail}")
    assert "Invalid input for param search_space" in detail and "gaussian" in detail, detail

    # Code hidden where the old schema did not look: inside a choice, or beside a primitive's arguments.
    marker = airflow.home / "pwned"
    payload = {"eval": f"__import__('pathlib').Path({str(marker)!r}).touch()"}
    for space in (
        {"alpha": {"choice": [0.001, payload]}},
        {"alpha": {"choice": [[payload]]}},
        {"alpha": {"loguniform": [1e-5, 1e-2], "eval": payload["eval"]}},
        {"eval": payload["eval"]},
    ):
        hostile = api.trigger(UI_DAG, {**GOOD_CONF, "search_space": space})
        assert hostile.status_code == 400, (space, hostile.text)
        assert "Invalid input for param search_space" in hostile.json()["detail"], hostile.text
    assert api.dag_runs(UI_DAG) == [], "a refused conf created a dag run"

    # 2. Unpause both DAGs and trigger the UI DAG as its form does.
    for dag_id in (UI_DAG, DEPLOY_DAG):
        assert api.unpause(dag_id)["is_paused"] is False
    resp = api.trigger(UI_DAG, GOOD_CONF)
    assert resp.status_code == 200, resp.text
    run = resp.json()
    run_id = run["dag_run_id"]
    assert run["logical_date"] is None and run["conf"] == GOOD_CONF and run["run_type"] == "manual"

    # 3. Follow the tune task instance until the run ends; catch it deferred, with our trigger, in the triggerer.
    tune_states: list[str] = []
    deferred: list[dict[str, Any]] = []  # the tune TI as the API showed it while deferred
    live_views: list[dict[str, Any]] = []  # the Experiment view's data while it was deferred
    deadline = time.monotonic() + 240
    state = run["state"]
    while time.monotonic() < deadline:
        airflow.check_alive()
        airflow.track()
        ti = api.task_instance(UI_DAG, run_id, "tune")
        if not tune_states or tune_states[-1] != ti["state"]:
            tune_states.append(ti["state"])
        if ti["state"] == "deferred":
            deferred.append(ti)
            if len(deferred) % 4 == 1:  # the Experiment view while the experiment runs, every ~2 s
                live_views.append(_view_data(airflow, api, run_id, "tune"))
        state = api.dag_run(UI_DAG, run_id)["state"]
        if state in ("success", "failed"):
            break
        time.sleep(0.5)
    states = api.task_instances(UI_DAG, run_id)
    assert state == "success", f"dag run {run_id} ended {state}: {states}; tune went {tune_states}"
    assert states == {"tune": "success", "promotion_requested": "success", "promote": "success"}, states

    assert "deferred" in tune_states, f"tune never seen deferred: {tune_states}"
    triggers = [ti["trigger"] for ti in deferred if ti.get("trigger")]
    assert triggers and {t["classpath"] for t in triggers} == {TRIGGER_CLASSPATH}, deferred[-1:]
    # Picked up by the running triggerer (3.3 always empties the trigger's kwargs in the API, so no job id here).
    assert any(t["triggerer_id"] is not None for t in triggers), triggers[-1]
    tune_ti = api.task_instance(UI_DAG, run_id, "tune")
    assert tune_ti["try_number"] == 1, "resuming from the deferral must not take a new try"

    # The trigger's progress lines reached the tune task's log (served by the API), logged by the trigger itself.
    events = _log_events(api.task_log(UI_DAG, run_id, "tune", 1))
    from_trigger = [e for e in events if e.get("logger") == TRIGGER_CLASSPATH]
    progress = [e for e in from_trigger if str(e.get("event", "")).startswith("[airflow-tune] ")]
    assert any(" trials: " in e["event"] for e in progress), "no trial progress from the trigger in the tune log:\n" + (
        json.dumps(events[-30:], indent=1)
    )
    fired = [e for e in events if e.get("event") == "Trigger fired event"]
    assert fired and "'status': 'SUCCEEDED'" in str(fired[-1].get("result")), fired

    # 4. The XCom result, read back through the REST API.
    value = api.xcom(UI_DAG, run_id, "tune")["value"]
    assert isinstance(value, dict), f"the XCom API returned {type(value).__name__}, not the JSON object: {value!r}"
    assert set(value["best_config"]) >= {"alpha", "eta0"}, value
    experiments = f"s3://{stack.bucket}/{prefix}/experiments/"
    assert str(value["best_checkpoint_uri"]).startswith(experiments), value["best_checkpoint_uri"]
    assert value["num_trials"] == 2 and value["num_errored"] == 0, value
    assert value["best_metrics"]["training_iteration"] <= GOOD_CONF["max_steps"], value["best_metrics"]
    bucket, _, key = str(value["best_checkpoint_uri"])[len("s3://") :].partition("/")
    listed = s3_client.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/")
    assert listed.get("KeyCount", 0) > 0, f"nothing at {value['best_checkpoint_uri']}"

    promoted = api.xcom(UI_DAG, run_id, "promote")["value"]
    assert promoted["promoted"] is True, promoted

    # The Experiment view: live while deferred (found through the task's rendered fields, before any result) ...
    assert live_views, "the view was never asked while the task was deferred"
    assert {v["state"] for v in live_views} <= {"starting", "experiment"}, live_views
    assert all(v["experiment_uri"] == value["experiment_uri"] for v in live_views), live_views[-1]
    assert all(v["refresh_s"] for v in live_views if v.get("status") != "succeeded"), live_views
    print(f"Experiment view while deferred: {[(v['state'], v.get('status')) for v in live_views]}")
    # ... and after the task finished, from its result, with the promotion of the same run.
    view = _view_data(airflow, api, run_id, "tune")
    result = _experiment_file(s3_client, value["experiment_uri"], "result.json")
    history = _experiment_file(s3_client, value["experiment_uri"], "history.json")
    assert view["state"] == "experiment" and view["status"] == "succeeded" and view["refresh_s"] is None, view
    assert view["experiment"] == value["experiment"] and view["best"]["trial_id"] == value["best_trial_id"]
    assert view["best_checkpoint_uri"] == value["best_checkpoint_uri"]
    assert view["ray_job_url"] == value["dashboard_url"]
    assert view["counts"] == {"TERMINATED": 2} and view["num_trials"] == 2
    assert {r["trial_id"] for r in view["table"]["rows"]} == {t["trial_id"] for t in result["trials"]}
    assert view["promotion"]["promoted"] is True and view["promotion"]["version"] == promoted["version"]
    assert view["promotion"]["task_id"] == "promote"
    # The engine wrote the curves: both trials, one point per reported iteration.
    assert set(history["trials"]) == {t["trial_id"] for t in result["trials"]}, history
    for trial in result["trials"]:
        points = history["trials"][trial["trial_id"]]["points"]
        assert [p[0] for p in points] == list(range(1, trial["metrics"]["training_iteration"] + 1)), points
    assert {c["trial_id"] for c in view["curves"]} == set(history["trials"])
    # A task that is not a tune task gets a sentence; without a token the API server refuses.
    other = _view_data(airflow, api, run_id, "promotion_requested")
    assert other["state"] == "not_tune" and "not a RayTuneOperator task" in other["message"], other
    query = {"dag_id": UI_DAG, "run_id": run_id, "task_id": "tune"}
    anonymous = httpx.get(f"{airflow.base_url}{VIEW_DATA}", params=query)
    assert anonymous.status_code == 401, anonymous.text
    for response in (view, other):
        assert stack.env()["AWS_SECRET_ACCESS_KEY"] not in json.dumps(response)
    FINISHED_RUNS.append(run_id)

    # 5. The promotion's Asset event starts the deploy DAG, which serves the new champion.
    deploy_runs = wait_until(lambda: api.dag_runs(DEPLOY_DAG), 60, "an asset-triggered run of the deploy DAG")
    assert len(deploy_runs) == 1, deploy_runs
    deploy_run = deploy_runs[0]
    assert deploy_run["run_type"] == "asset_triggered", deploy_run
    deploy_id = deploy_run["dag_run_id"]

    def deploy_finished() -> dict[str, Any] | None:
        airflow.check_alive()
        current = api.dag_run(DEPLOY_DAG, deploy_id)
        return current if current["state"] in ("success", "failed") else None

    final = wait_until(deploy_finished, 120, "the deploy run to finish")
    assert final["state"] == "success", api.task_instances(DEPLOY_DAG, deploy_id)
    # ... because of the registry Asset event that this run's promote task emitted. (Asked only now: in 3.3.2 this
    # endpoint answers 500 while a run it lists has no start_date yet, DagRunAssetReference.start_date not nullable.)
    consumed = api.get_json(f"/dags/{DEPLOY_DAG}/dagRuns/{deploy_id}/upstreamAssetEvents")["asset_events"]
    registry_uri = f"s3://{stack.bucket}/{prefix}/models/digits"
    assert [(e["uri"], e["source_dag_id"], e["source_run_id"], e["source_task_id"]) for e in consumed] == [
        (registry_uri, UI_DAG, run_id, "promote")
    ], consumed

    served = api.xcom(DEPLOY_DAG, deploy_id, "deploy_champion")["value"]
    assert served["version"] == promoted["version"], (served, promoted)
    assert served["holdout_accuracy"] > 0.5, served
    assert not marker.exists(), "a refused conf's payload ran"


# -- the Experiment view in a real browser ---------------------------------------------------------------------------
#: Counts, in the page, the plot's pixels of each curve's colour (the chart is a canvas: this is what it drew).
_PLOT_PIXELS_JS = """
() => {
  const view = window.experimentView;
  const canvas = document.querySelector("#plot canvas");
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const counts = view.colors.map((hex) => {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
    let n = 0;
    for (let i = 0; i < pixels.length; i += 4) {
      const off = Math.abs(pixels[i] - r) + Math.abs(pixels[i + 1] - g) + Math.abs(pixels[i + 2] - b);
      if (pixels[i + 3] > 200 && off < 40) n++;
    }
    return n;
  });
  return {
    series: view.plot.series.slice(1).map((s) => s.label),
    points: view.plot.data.slice(1).map((ys) => ys.filter((y) => y !== null).length),
    curves: view.data.curves.map((c) => c.trial_id),
    counts: counts,
  };
}
"""


def _finished_tune_run(airflow: RealAirflow, api: ApiClient) -> str:
    """A run of the UI DAG whose tune task succeeded: the scenario's, or a new one when this test runs alone."""
    if FINISHED_RUNS:
        return FINISHED_RUNS[-1]
    wait_until(lambda: api.request("GET", f"/dags/{UI_DAG}").status_code == 200, 90, "the UI DAG to be parsed")
    api.unpause(UI_DAG)
    resp = api.trigger(UI_DAG, {**GOOD_CONF, "promote": False})
    assert resp.status_code == 200, resp.text
    run_id = str(resp.json()["dag_run_id"])

    def ended() -> str | None:
        airflow.check_alive()
        state = api.dag_run(UI_DAG, run_id)["state"]
        return state if state in ("success", "failed") else None

    assert wait_until(ended, 240, "the UI DAG run to end") == "success", api.task_instances(UI_DAG, run_id)
    return run_id


@pytest.mark.skipif(browser.unavailable() is not None, reason=str(browser.unavailable()))
def test_experiment_view_in_a_real_browser(airflow: RealAirflow, api: ApiClient, s3_client: Any) -> None:
    """Chromium logs in through Airflow's login form, opens the Experiment tab of a finished tune task, and checks
    the trial table against result.json and that the plot draws one curve per plotted trial; saves a screenshot."""
    from playwright.sync_api import sync_playwright

    run_id = _finished_tune_run(airflow, api)
    value = api.xcom(UI_DAG, run_id, "tune")["value"]
    result = _experiment_file(s3_client, value["experiment_uri"], "result.json")
    history = _experiment_file(s3_client, value["experiment_uri"], "history.json")
    browser.ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = browser.ARTIFACTS / "experiment-view.png"
    started = time.monotonic()
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=browser.CHROMIUM, args=browser.ARGS)
        try:
            page = chromium.new_page(viewport={"width": 1400, "height": 1400})
            page.set_default_timeout(60_000)
            # The task instance's page: Airflow sends the browser to its login form first.
            page.goto(f"{airflow.base_url}/dags/{UI_DAG}/runs/{quote(run_id, safe='')}/tasks/tune")
            page.locator("input[name=username]").fill(USERNAME)
            page.locator("input[name=password]").fill(airflow.password)
            page.locator("button[type=submit]").click()
            page.wait_for_url("**/tasks/tune")
            page.get_by_role("link", name="Experiment", exact=True).click()
            page.wait_for_url("**/tasks/tune/plugin/airflow-tune-experiment")
            view = page.frame_locator("iframe[title=Experiment]")
            view.locator("body[data-state=ready]").wait_for()
            frame = next(f for f in page.frames if "/airflow-tune/experiment?" in f.url)
            page.wait_for_timeout(500)  # let the canvas settle before the screenshot
            page.screenshot(path=str(screenshot))
            print(f"screenshot of the Experiment view: {screenshot}")

            # The header.
            assert view.locator("#name").inner_text() == value["experiment"]
            assert view.locator("#status").inner_text().lower() == "succeeded"
            assert view.locator("#checkpoint").inner_text() == value["best_checkpoint_uri"]
            assert value["best_trial_id"] in view.locator("#best").inner_text()
            # The table: one row per trial of result.json, best first (mode max), the best marked.
            rows = view.locator("#trials tbody tr")
            ids = [rows.nth(i).get_attribute("data-trial-id") for i in range(rows.count())]
            by_value = sorted(result["trials"], key=lambda t: -t["metrics"][value["metric"]])
            assert ids == [t["trial_id"] for t in by_value], ids
            assert view.locator("#trials tbody tr.best").get_attribute("data-trial-id") == value["best_trial_id"]
            for i, trial in enumerate(by_value):
                cells = rows.nth(i).locator("td")
                assert cells.nth(1).inner_text() == "TERMINATED"
                assert float(cells.nth(3).inner_text()) == pytest.approx(trial["metrics"][value["metric"]], rel=1e-5)
            # The plot: one series per plotted trial, each drawn on the canvas in its own colour.
            plot = frame.evaluate(_PLOT_PIXELS_JS)
            print(f"plot: {plot}")
            assert sorted(plot["curves"]) == sorted(history["trials"]), plot
            assert [s.split(" ")[0] for s in plot["series"]] == plot["curves"], plot
            assert plot["points"] == [len(history["trials"][t]["points"]) for t in plot["curves"]], plot
            assert all(n >= 20 for n in plot["counts"]), f"a curve was not drawn: {plot}"
        finally:
            chromium.close()
    print(f"browser check took {time.monotonic() - started:.1f}s")


def _compose_jobs_checks(tmp_path: Path) -> dict[str, str]:
    """The ``CMD-SHELL`` healthchecks docker/ gives Airflow's dag processor and triggerer, as compose resolves them."""
    import shutil

    from tests.unit.local.test_compose import ENV_EXAMPLE, compose_config

    env = tmp_path / "env"
    shutil.copy(ENV_EXAMPLE, env)
    services = compose_config(env)["services"]
    checks = {}
    for name in ("airflow-dag-processor", "airflow-triggerer"):
        kind, command = services[name]["healthcheck"]["test"]
        assert kind == "CMD-SHELL" and command.startswith("airflow jobs check "), (name, kind, command)
        # compose's config output keeps "$$" escaped; the container's shell gets "$" (compose un-escapes it there).
        checks[name] = command.replace("$$", "$")
    return checks


def test_the_compose_jobs_checks_pass_on_live_components_and_fail_without_them(
    airflow: RealAirflow, tmp_path: Path
) -> None:
    """docker/'s dag-processor and triggerer healthchecks, run by a shell as compose runs them, against this module's
    real Airflow: they pass on the host whose components run (Airflow records each job's host by its
    ``hostname_callable``, which in a compose container is its $HOSTNAME) and fail for a host where none runs."""
    import subprocess

    from airflow.utils.net import get_hostname

    checks = _compose_jobs_checks(tmp_path)
    for name, command in checks.items():
        for hostname, ok in ((get_hostname(), True), ("no-such-component-host", False)):
            done = subprocess.run(
                ["sh", "-c", command],
                env={**airflow.env, "HOSTNAME": hostname, "PATH": f"{Path(airflow.airflow).parent}:/usr/bin:/bin"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert (done.returncode == 0) is ok, (
                name,
                hostname,
                done.returncode,
                done.stdout[-2000:],
                done.stderr[-2000:],
            )
