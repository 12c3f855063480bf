"""The older supported Airflow releases (3.1, the oldest, and 3.2, each in an environment of its own with the
provider and no Ray) as real processes (API server, scheduler, dag processor, triggerer; their own AIRFLOW_HOME: their
schemas are not 3.3's) against the session's Ray head and S3 endpoint: a blocking and a deferred task give the XCom
contract, the Experiment view is served by that release's API server, a deferred RayTuneSensor follows a submitted
job and PromoteCheckpointOperator promotes its winner (and, gated off, skips its downstream task through that
release's SkipMixin), and a task marked failed while deferred stops its Ray job (before 3.3 there is no
``BaseTrigger.on_kill``: the trigger asks for its task's state when cancelled; shown on the oldest release, the path of
every release before 3.3).
One Airflow at a time serves the module's tests for its release.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_tune.common.contract import RESULT_KEYS
from airflow_tune.registries.s3 import read_champion, s3_client
from tests.e2e.helpers import experiment, jobs_of, stop_live_jobs
from tests.e2e.real_airflow import USERNAME, ApiClient, RealAirflow, wait_until
from tests.support.compat_envs import AIRFLOW_RELEASES, airflow_python
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(300)

DAGS = Path(__file__).resolve().parent / "airflow_dags"
DAG_IDS = ("aft_compat_modes", "aft_compat_kill", "aft_compat_sensor_promote")
VIEW = "/airflow-tune/experiment"
TRIGGER_CLASSPATH = "airflow_tune.triggers.tune.RayTuneTrigger"
#: A kill is seen by the triggerer within a few of its loops; then the state lookup (3.1's triggerer starts its
#: in-process execution API on the first one: seconds, tens of them on a loaded machine) and the stop (the driver
#: saves Tune's state, SIGKILL after the DAG's stop_wait_s=20) follow.
KILL_STOPS_WITHIN_S = 120


def _in_env(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module", params=AIRFLOW_RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def airflow(release: str, stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAirflow]:
    python = airflow_python(release)
    prefix = f"compat-airflow-{uuid.uuid4().hex[:8]}"
    env = {
        **stack.env(),
        "AIRFLOW_TUNE_STORAGE_URI": f"s3://{stack.bucket}/{prefix}/experiments",
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    home = tmp_path_factory.mktemp(f"airflow-{release}") / "home"
    real = RealAirflow(home, DAGS, env, airflow=str(python.parent / "airflow"))
    started = time.monotonic()
    try:
        try:
            real.start()
        except BaseException:
            print(real.diagnostics())
            raise
        yield real
    finally:
        left = real.stop()
        print(f"Airflow {release} processes up for {time.monotonic() - started:.0f}s: " + str(real.timings))
        assert not left, f"processes left after stopping Airflow: {left}"


@pytest.fixture(scope="module")
def api(airflow: RealAirflow) -> Iterator[ApiClient]:
    client = ApiClient(airflow.base_url, USERNAME, airflow.password)
    try:

        def parsed() -> bool:
            airflow.check_alive()
            errors = client.import_errors()
            assert not errors, errors
            return {d["dag_id"] for d in client.get_json("/dags")["dags"]} >= set(DAG_IDS)

        wait_until(parsed, 120, f"the dag processor to parse {DAG_IDS}")
        yield client
    finally:
        client.close()


def _trigger(api: ApiClient, dag_id: str, conf: dict[str, Any]) -> str:
    api.unpause(dag_id)
    resp = api.trigger(dag_id, conf)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["dag_run_id"])


def _wait_for_run(airflow: RealAirflow, api: ApiClient, dag_id: str, run_id: str, seen: set[str]) -> str:
    def finished() -> str | None:
        airflow.check_alive()
        seen.update(str(s) for s in api.task_instances(dag_id, run_id).values())
        state = api.dag_run(dag_id, run_id)["state"]
        return state if state in ("success", "failed") else None

    try:
        return str(wait_until(finished, 180, f"{dag_id} run {run_id} to finish", interval=0.5))
    except AssertionError:
        print(airflow.diagnostics())
        raise


def test_the_environment_is_its_airflow_without_ray(release: str) -> None:
    found = _in_env(
        airflow_python(release),
        "import importlib.metadata as m, importlib.util as u; print(m.version('apache-airflow'), u.find_spec('ray'))",
    )
    assert found.stdout.split() == [release, "None"], found.stdout + found.stderr[-2000:]


def test_blocking_and_deferred_give_the_xcom_contract_and_the_view_is_served(release, airflow, api, stack) -> None:
    started = time.monotonic()
    run_id = _trigger(api, "aft_compat_modes", {})
    seen: set[str] = set()
    state = _wait_for_run(airflow, api, "aft_compat_modes", run_id, seen)
    states = api.task_instances("aft_compat_modes", run_id)
    assert state == "success" and states == {"blocking": "success", "deferred": "success"}, (states, seen)
    assert "deferred" in seen, f"the deferred task was never seen deferred: {seen}"
    deferred_ti = api.task_instance("aft_compat_modes", run_id, "deferred")
    assert deferred_ti["try_number"] == 1, "resuming from the deferral must not take a new try"

    results = {}
    for task_id in ("blocking", "deferred"):
        result = api.xcom("aft_compat_modes", run_id, task_id)["value"]
        assert isinstance(result, dict) and set(result) == set(RESULT_KEYS), result
        assert result["experiment"] == experiment("aft_compat_modes", run_id, task_id)
        assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["num_errored"] == 0, result
        assert result["best_config"] == {"x": 3, "steps": 2}, result
        assert result["best_checkpoint_uri"].startswith(f"{result['experiment_uri']}/"), result
        [job] = jobs_of(result["experiment"])
        assert job["submission_id"] == result["job_id"] and job["status"] == "SUCCEEDED", job
        results[task_id] = result
    for key in ("metric", "mode", "best_config", "num_trials"):
        assert results["blocking"][key] == results["deferred"][key], key
    assert results["blocking"]["best_metrics"]["loss"] == results["deferred"]["best_metrics"]["loss"]

    # The Experiment view, served by this release's API server: its tab is registered, its page and data answer.
    plugins = api.get_json("/plugins")["plugins"]
    views = [v for p in plugins for v in p.get("external_views") or []]
    assert any(v["name"] == "Experiment" and v["destination"] == "task_instance" for v in views), plugins
    query = {"dag_id": "aft_compat_modes", "run_id": run_id, "task_id": "deferred", "map_index": "-1"}
    page = api.http.get(f"{airflow.base_url}{VIEW}", params=query)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"], page.text[:2000]
    data = api.http.get(f"{airflow.base_url}{VIEW}/data", params=query)
    assert data.status_code == 200, data.text[:2000]
    view = data.json()
    assert view["state"] == "experiment" and view["status"] == "succeeded", view
    assert view["experiment_uri"] == results["deferred"]["experiment_uri"]
    assert view["counts"] == {"TERMINATED": 2} and view["num_trials"] == 2, view
    assert httpx.get(f"{airflow.base_url}{VIEW}/data", params=query).status_code == 401
    print(f"Airflow {release}: blocking + deferred run and the view in {time.monotonic() - started:.0f}s")


def test_the_sensor_and_the_promotion_run_and_a_held_back_promotion_skips_downstream(release, airflow, api, stack):
    run_id = _trigger(api, "aft_compat_sensor_promote", {})
    seen: set[str] = set()
    state = _wait_for_run(airflow, api, "aft_compat_sensor_promote", run_id, seen)
    states = api.task_instances("aft_compat_sensor_promote", run_id)
    assert state == "success", (states, seen)
    assert states == {
        "submit": "success",
        "sense": "success",
        "promote": "success",
        "deploy": "success",
        "held_back": "success",
        "deploy_held_back": "skipped",
    }, states
    assert "deferred" in seen, f"the sensor was never seen deferred: {seen}"

    submitted = api.xcom("aft_compat_sensor_promote", run_id, "submit")["value"]
    sensed = api.xcom("aft_compat_sensor_promote", run_id, "sense")["value"]
    assert isinstance(sensed, dict) and set(sensed) == {*RESULT_KEYS, "finished"} and sensed["finished"], sensed
    assert sensed["experiment"] == submitted["experiment"] == experiment("aft_compat_sensor_promote", run_id, "submit")
    assert sensed["job_id"] == submitted["job_id"] and sensed["num_terminated"] == 2, sensed
    assert sensed["best_config"] == {"x": 3, "steps": 2}, sensed

    promoted = api.xcom("aft_compat_sensor_promote", run_id, "promote")["value"]
    assert promoted["promoted"] is True and promoted["version"], promoted
    assert api.xcom("aft_compat_sensor_promote", run_id, "deploy")["value"] == promoted["version"]
    held = api.xcom("aft_compat_sensor_promote", run_id, "held_back")["value"]
    assert held["promoted"] is False and "misses threshold" in held["reason"], held
    registries = airflow.env["AIRFLOW_TUNE_STORAGE_URI"].rsplit("/", 1)[0]
    champion = read_champion(f"{registries}/registry", s3_client(None))
    assert champion is not None and champion["version"] == promoted["version"], champion
    assert champion["source_checkpoint_uri"] == sensed["best_checkpoint_uri"], champion
    assert read_champion(f"{registries}/registry-held-back", s3_client(None)) is None


# Before 3.3 every release takes the same path (its triggerer has no ``BaseTrigger.on_kill``): run at the oldest.
@pytest.mark.parametrize("release", AIRFLOW_RELEASES[:1], indirect=True)
def test_a_task_marked_failed_while_deferred_stops_its_ray_job(release, airflow, api, tmp_path) -> None:
    marks, gate = tmp_path / "marks", tmp_path / "gate"
    gate.write_text("held")  # every trial waits after its step 0 while this file exists: the job never ends alone
    space = {"x": {"grid_search": [1, 3]}, "steps": 4, "marker_dir": str(marks), "gate": {"step": 0, "file": str(gate)}}
    run_id = _trigger(api, "aft_compat_kill", {"space": space})
    name = experiment("aft_compat_kill", run_id, "deferred")
    try:

        def deferred_and_running() -> dict[str, Any] | None:
            airflow.check_alive()
            ti = api.task_instance("aft_compat_kill", run_id, "deferred")
            assert ti["state"] in (None, "scheduled", "queued", "running", "deferred"), ti
            trigger = ti.get("trigger") or {}
            picked_up = ti["state"] == "deferred" and trigger.get("triggerer_id") is not None
            return ti if picked_up and len(read_markers(str(marks), "step")) == 2 else None

        ti = wait_until(deferred_and_running, 150, "the task deferred in the triggerer, both trials at the gate", 0.5)
        assert ti["trigger"]["classpath"] == TRIGGER_CLASSPATH, ti
        [job] = jobs_of(name)
        assert job["status"] == "RUNNING", job

        resp = api.request(
            "PATCH", f"/dags/aft_compat_kill/dagRuns/{run_id}/taskInstances/deferred", json={"new_state": "failed"}
        )
        assert resp.status_code == 200, resp.text
        killed = time.monotonic()

        def stopped() -> dict[str, Any] | None:
            airflow.check_alive()
            [now] = jobs_of(name)
            return now if now["status"] not in ("PENDING", "RUNNING") else None

        final = wait_until(stopped, KILL_STOPS_WITHIN_S, f"Ray job {job['submission_id']} to stop after the kill")
        assert final["status"] == "STOPPED", final
        print(f"Airflow {release}: the Ray job stopped {time.monotonic() - killed:.1f}s after the kill")
        assert not read_markers(str(marks), "end"), "a trial ran to its end: the job was not stopped mid-experiment"
        assert api.task_instance("aft_compat_kill", run_id, "deferred")["state"] == "failed"
    finally:
        gate.unlink(missing_ok=True)
        stop_live_jobs(name)
