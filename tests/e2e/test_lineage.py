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


@pytest.mark.timeout(300)
def test_complete_events_carry_the_experiment_best_checkpoint_and_registry_version(tmp_path):
    registry = f"s3://airflow-tune/e2e-registry/lineage-{uuid.uuid4().hex[:8]}"
    events_file = tmp_path / "openlineage.jsonl"
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
    result, decision = xcom["tune"], xcom["promote"]
    assert result["num_trials"] == 2 and result["best_checkpoint_uri"].startswith(result["experiment_uri"] + "/")
    assert decision["promoted"] is True and decision["version"]

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    complete = {}
    for event in events:
        if event.get("eventType") == "COMPLETE" and event["job"]["name"].startswith("aft_lineage."):
            assert event["job"]["name"] not in complete, "one COMPLETE event per task"
            complete[event["job"]["name"]] = event
    assert set(complete) >= {"aft_lineage.tune", "aft_lineage.promote"}, [
        (e.get("eventType"), e.get("job", {}).get("name")) for e in events
    ]

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
