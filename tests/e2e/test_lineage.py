"""OpenLineage on the real stack: a DAG (a deferred tune task warm-started from a registry, then a promotion) run by
``dag.test()`` against the local Ray head and S3 endpoint, with the OpenLineage provider's file transport configured
through the environment, as a deployment does. The provider reads its configuration once per process, so the DAG
runs in a process of its own (``run_dag.py``); every other test runs with OpenLineage disabled (no transport).

``dag.test()`` runs each task through the task SDK's ``run()`` and ``finalize()``, which calls the listeners'
``on_task_instance_success``, as a worker does; the deferred task resumes in ``execute_complete`` on the operator
instance the listener is then given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.e2e.helpers import RUN_DAG, kill_dag_process

pytestmark = pytest.mark.usefixtures("stack")


def _line(output: str, marker: str) -> str:
    found = [line[len(marker) + 1 :] for line in output.splitlines() if line.startswith(marker + " ")]
    assert found, output[-5000:]
    return found[-1]


def _dataset(uri: str) -> tuple[str, str]:
    """OpenLineage's naming of an s3:// URI, written out here rather than taken from the code under test."""
    assert uri.startswith("s3://"), uri
    bucket, _, key = uri[len("s3://") :].partition("/")
    return f"s3://{bucket}", key.rstrip("/")


def _names(datasets: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


@pytest.fixture(scope="module")
def lineage_run(stack, tmp_path_factory) -> dict[str, Any]:
    """One run of the DAG: its XCom results, its registry and the COMPLETE event of each task."""
    registry = f"s3://airflow-tune/e2e-registry/lineage-{uuid.uuid4().hex[:8]}"
    events_file = tmp_path_factory.mktemp("lineage") / "openlineage.jsonl"
    env = {
        **os.environ,
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "airflow-tune-e2e",
        # The listener gives up on an event after execution_timeout (10 s by default) and drops it: on a loaded
        # machine (a full test run) the task process's emission can take longer. The events are the subject here.
        "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "120",
    }
    logical_date = datetime(2003, 3, 3, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    args = [sys.executable, str(RUN_DAG), "aft_lineage", logical_date.isoformat(), json.dumps({"registry": registry})]
    proc = subprocess.Popen(
        [*args, "lineage_cases.py"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=240)
    finally:
        kill_dag_process(proc)
    state = _line(output, "DAG_RUN_STATE")
    assert proc.returncode == 0 and state.startswith("success "), output[-5000:]
    xcom = json.JSONDecoder().raw_decode(_line(output, "DAG_RUN_XCOM"))[0]

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    complete = {}
    for event in events:
        if event.get("eventType") == "COMPLETE" and event["job"]["name"].startswith("aft_lineage."):
            assert event["job"]["name"] not in complete, "one COMPLETE event per task"
            complete[event["job"]["name"]] = event
    assert set(complete) >= {"aft_lineage.tune", "aft_lineage.promote", "aft_lineage.promote_held"}, [
        (e.get("eventType"), e.get("job", {}).get("name")) for e in events
    ]
    return {"xcom": xcom, "registry": registry, "complete": complete}


@pytest.mark.timeout(300)
def test_complete_events_carry_the_experiment_best_checkpoint_and_registry_version(lineage_run):
    registry, complete = lineage_run["registry"], lineage_run["complete"]
    result, decision = lineage_run["xcom"]["tune"], lineage_run["xcom"]["promote"]
    assert result["num_trials"] == 2 and result["best_checkpoint_uri"].startswith(result["experiment_uri"] + "/")
    assert decision["promoted"] is True and decision["version"]

    tune = complete["aft_lineage.tune"]
    assert tune["job"]["namespace"] == "airflow-tune-e2e"
    assert _names(tune["outputs"]) == {_dataset(result["experiment_uri"]), _dataset(result["best_checkpoint_uri"])}
    # The warm start read the registry (it had no champion yet, so the search ran cold).
    assert _names(tune["inputs"]) == {_dataset(registry)}

    promote = complete["aft_lineage.promote"]
    assert _names(promote["inputs"]) == {_dataset(result["best_checkpoint_uri"])}
    version = _dataset(f"{registry}/versions/{decision['version']}")
    assert _names(promote["outputs"]) == {version, _dataset(registry)}
    assert decision["uri"] == f"{registry}/versions/{decision['version']}/checkpoint"


def _parameters(event: dict[str, Any]) -> dict[str, str]:
    facet = event["run"]["facets"]["executionParameters"]
    keys = [p["key"] for p in facet["parameters"]]
    assert len(keys) == len(set(keys)), keys
    return {p["key"]: p["value"] for p in facet["parameters"]}


@pytest.mark.timeout(300)
def test_complete_events_carry_the_search_its_winner_and_the_gates_decisions(lineage_run):
    """The tune task's COMPLETE event names the search and its real winner, each promote task's its gate's decision,
    in OpenLineage's executionParameters run facet; every run facet of the three events validates against the spec's
    run facet schema, and ours against the execution parameters facet's."""
    from tests.support.openlineage_schemas import EXECUTION_PARAMETERS_SCHEMA_URL, validate_run_facet

    complete, xcom = lineage_run["complete"], lineage_run["xcom"]
    result = xcom["tune"]
    for event in complete.values():
        for facet in event["run"]["facets"].values():
            validate_run_facet(facet)
        assert event["run"]["facets"]["executionParameters"]["_schemaURL"] == EXECUTION_PARAMETERS_SCHEMA_URL

    tune = _parameters(complete["aft_lineage.tune"])
    # The winner as the job found it (x=3 is the grid's best: its loss is 0.01), written out here.
    assert result["best_config"] == {"x": 3, "steps": 2}
    assert json.loads(tune["tune.best_config"]) == result["best_config"]
    assert json.loads(tune["tune.search_space"]) == {"x": {"grid_search": [1, 3]}, "steps": 2}
    assert tune["tune.metric"] == "loss" and tune["tune.mode"] == "min"
    assert float(tune["tune.best_value"]) == result["best_metrics"]["loss"] == pytest.approx(0.01)
    assert tune["tune.num_trials"] == "2" and tune["tune.best_trial_id"] == result["best_trial_id"]
    assert tune["tune.experiment"] == result["experiment"]

    promoted, held = xcom["promote"], xcom["promote_held"]
    promote = _parameters(complete["aft_lineage.promote"])
    assert promote["promote.promoted"] == "true" and promote["promote.gate"] == "always"
    assert promote["promote.version"] == promoted["version"] and promote["promote.reason"] == promoted["reason"]
    assert held["promoted"] is False and held["version"] is None
    held_params = _parameters(complete["aft_lineage.promote_held"])
    assert held_params["promote.promoted"] == "false" and "promote.version" not in held_params
    assert held_params["promote.reason"] == held["reason"] and "misses threshold 0.001" in held["reason"]
    assert held_params["promote.gate"] == "threshold" and float(held_params["promote.threshold"]) == 0.001
    # The held-back promotion wrote nothing.
    assert complete["aft_lineage.promote_held"]["outputs"] == []
