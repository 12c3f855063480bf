"""The Experiment view refuses another DAG's experiment, through the real API server with per-DAG permissions.

The real Airflow processes (tests/e2e/real_airflow.py) with a test auth manager that lets one user read only DAG A
(:mod:`tests.support.dag_auth_manager`, a Simple auth manager with per-DAG rules). A's tune task has an XCom edited
through the public REST API (as anyone allowed to write A's XComs can) to point at DAG B's experiment: the user, who
may read A but not B, asks the view for A's task and gets the refusal naming B's owner, and no value of B's files.
The same user asking for A's own experiment sees it. The experiments' files are fabricated in the session's S3
endpoint with the engine's own code (what is tested is the view's decision, not the engine); no Ray job runs.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.real_airflow import USERNAME, ApiClient, RealAirflow, wait_until

pytestmark = pytest.mark.timeout(400)

REPO = Path(__file__).resolve().parents[2]
DAG_A, DAG_B = "view_owner_a", "view_owner_b"
READER = "dag-a-reader"
MARK = "b-secret-value"
VIEW_DATA = "/airflow-tune/experiment/data"
DAG_FILE = '''"""Two DAGs with a tune task each; their runs never start (the DAGs stay paused)."""
from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

for dag_id in ("view_owner_a", "view_owner_b"):
    with DAG(dag_id, schedule=None, catchup=False, tags=["test"]) as dag:
        RayTuneOperator(
            task_id="tune",
            trainable="tune_testkit.functions:checkpointing",
            storage_path="s3://airflow-tune/experiments",
            metric="loss",
            mode="min",
            param_space={"x": {"grid_search": [1, 3]}},
        )
    globals()[dag_id] = dag
'''


@pytest.fixture(scope="module")
def airflow(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAirflow]:
    dags = tmp_path_factory.mktemp("view-owner-dags")
    (dags / "view_owner_dags.py").write_text(DAG_FILE)
    real = RealAirflow(tmp_path_factory.mktemp("view-owner") / "home", dags, stack.env())
    real.env.update(
        {
            "AIRFLOW__CORE__AUTH_MANAGER": "tests.support.dag_auth_manager.DagAccessAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin,{READER}:viewer",
            "AIRFLOW_TUNE_TEST_DAG_ACCESS": f"{READER}={DAG_A}",
            "PYTHONPATH": ":".join(filter(None, [str(REPO), real.env.get("PYTHONPATH")])),
        }
    )
    try:
        try:
            real.start()
        except BaseException:
            print(real.diagnostics())
            raise
        yield real
    finally:
        left = real.stop()
        assert not left, f"processes left after stopping Airflow: {left}"


@pytest.fixture(scope="module")
def admin(airflow: RealAirflow) -> Iterator[ApiClient]:
    client = ApiClient(airflow.base_url, USERNAME, airflow.password)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def reader(airflow: RealAirflow) -> Iterator[ApiClient]:
    """The user who may read DAG A only; the API server generated its password at start."""
    password = json.loads((airflow.home / "passwords.json").read_text())[READER]
    client = ApiClient(airflow.base_url, READER, password)
    try:
        yield client
    finally:
        client.close()


def _experiment(storage_path: str, name: str, owner: dict[str, Any], mark: bool) -> str:
    """An experiment's files in S3, made with the engine's own code; ``mark`` puts a marker in every config."""
    from airflow_tune.common import storage
    from airflow_tune.common.contract import manifest_uri
    from tests.support.experiment_files import make_experiment

    made = make_experiment(storage_path, name, 3, iterations=3, owner=owner)
    uri = made.spec.experiment_uri

    def marked(value: Any) -> Any:
        if isinstance(value, dict):
            out = {k: marked(v) for k, v in value.items()}
            for key in ("config", "best_config"):
                if isinstance(out.get(key), dict):
                    out[key]["marker"] = MARK
            return out
        return [marked(v) for v in value] if isinstance(value, list) else value

    for file in ("progress.json", "result.json", "history.json") if mark else ():
        storage.write_json(manifest_uri(uri, file), marked(storage.read_json(manifest_uri(uri, file))))
    return uri


def _run_with_xcom(admin: ApiClient, dag_id: str, experiment_uri: str) -> str:
    """A run of ``dag_id`` (paused: its tasks never start) whose tune task's XCom names ``experiment_uri``."""
    resp = admin.trigger(dag_id, {})
    assert resp.status_code == 200, resp.text
    run_id = str(resp.json()["dag_run_id"])
    value = {"experiment": experiment_uri.rsplit("/", 1)[-1], "experiment_uri": experiment_uri}
    created = admin.request(
        "POST",
        f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/tune/xcomEntries",
        json={"key": "return_value", "value": value, "map_index": -1},
    )
    assert created.status_code == 201, created.text
    return run_id


def _view(client: ApiClient, airflow: RealAirflow, dag_id: str, run_id: str) -> Any:
    query = {"dag_id": dag_id, "run_id": run_id, "task_id": "tune", "map_index": "{MAP_INDEX}"}
    return client.http.get(f"{airflow.base_url}{VIEW_DATA}", params=query)


def test_a_reader_of_dag_a_is_refused_dag_bs_experiment(airflow, admin, reader, stack):
    try:
        _scenario(airflow, admin, reader, stack)
    except BaseException:
        print(airflow.diagnostics())
        raise


def _scenario(airflow: RealAirflow, admin: ApiClient, reader: ApiClient, stack: Any) -> None:
    from tests.support.experiment_files import METRIC, owner_record

    def parsed() -> bool:
        airflow.check_alive()
        return all(admin.request("GET", f"/dags/{d}").status_code == 200 for d in (DAG_A, DAG_B))

    wait_until(parsed, 90, "the dag processor to parse the two DAGs")
    assert admin.import_errors() == []
    # The per-DAG permissions hold in the real API server: the reader sees A, not B.
    assert reader.request("GET", f"/dags/{DAG_A}").status_code == 200
    assert reader.request("GET", f"/dags/{DAG_B}").status_code == 403

    storage_path = f"s3://{stack.bucket}/view-owner-{uuid.uuid4().hex[:8]}"
    theirs = _experiment(storage_path, "b_experiment", owner_record(DAG_B), mark=True)
    ours = _experiment(storage_path, "a_experiment", owner_record(DAG_A), mark=False)
    pointed_at_b = _run_with_xcom(admin, DAG_A, theirs)
    own = _run_with_xcom(admin, DAG_A, ours)
    b_run = _run_with_xcom(admin, DAG_B, theirs)

    # A's task pointing at B's experiment: a refusal naming B's owner, and nothing of B's files.
    resp = _view(reader, airflow, DAG_A, pointed_at_b)
    assert resp.status_code == 200, resp.text
    view = resp.json()
    print(f"the reader of {DAG_A}, asking for B's experiment: {view['message']}")
    assert view["state"] == "refused", view
    assert view["message"] == (
        f"Experiment b_experiment belongs to DAG {DAG_B!r}, task 'tune', not to DAG {DAG_A!r}: it is not shown here."
    )
    for leaked in (MARK, METRIC, "exp_0000", "checkpoint", "b_experiment-1"):
        assert leaked not in resp.text, (leaked, resp.text)
    assert set(view) == {"state", "message", "task", "refresh_s", "experiment", "experiment_uri"}
    # The admin, who may read B too, gets the same refusal on A's page: the page is A's.
    assert _view(admin, airflow, DAG_A, pointed_at_b).json()["state"] == "refused"

    # A's own experiment, for the same user: shown.
    mine = _view(reader, airflow, DAG_A, own)
    assert mine.status_code == 200, mine.text
    shown = mine.json()
    assert shown["state"] == "experiment" and shown["experiment_uri"] == ours, shown
    assert shown["owner"] == owner_record(DAG_A) and shown["num_trials"] == 3 and shown["metric"] == METRIC
    assert len(shown["table"]["rows"]) == 3 and len(shown["curves"]) == 3

    # B's own task: not this user's to read at all (the data endpoint's requires_access_dag).
    assert _view(reader, airflow, DAG_B, b_run).status_code == 403
    assert _view(admin, airflow, DAG_B, b_run).json()["state"] == "experiment"
