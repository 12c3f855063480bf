"""Tune's code objects written in the DAG file (a Stopper object, a stop function, a Stopper class by import path,
``tune.with_parameters(train, data=...)``, ``tune.sample_from(lambda spec: ...)``) run through RayTuneOperator on the
real stack as plain Tune runs them; what cannot travel is refused before submission naming the field and the fix."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import SPEC_FILE, TRIALS_FILE, manifest_uri
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag, run_id_for

pytestmark = pytest.mark.usefixtures("stack")


@pytest.mark.timeout(420)
def test_stoppers_with_parameters_and_sample_from_of_the_dag_file_run_as_tune_runs_them():
    date = datetime(2013, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    dag = load_dag("aft_code_objects", "code_objects.py")
    # No callable is left in a templated argument for Airflow's renderer to call with context=.
    task = dag.get_task("tune_code")
    assert not any(callable(entry) for entry in task.stop), task.stop
    run = run_dag(dag, logical_date=date)
    states = run.task_states()

    assert states["tune_code"] == "success", run.errors("tune_code")
    result = run.xcom("tune_code")
    spec = storage.read_json(manifest_uri(result["experiment_uri"], SPEC_FILE))
    rows = storage.read_json(manifest_uri(result["experiment_uri"], TRIALS_FILE))["trials"]
    assert result["num_trials"] == len(rows) == 3 and result["num_errored"] == 0, rows
    by_kind = {row["config"]["kind"]: row for row in rows}
    # sample_from's lambda ran on the cluster with the trial's resolved config.
    assert {kind: row["config"]["x"] for kind, row in by_kind.items()} == {"a": 7, "b": 11, "c": 13}
    # Each stopper stopped its own trial at its iteration (10 without them): the object, the function, the class.
    assert {kind: row["metrics"]["training_iteration"] for kind, row in by_kind.items()} == {"a": 2, "b": 3, "c": 4}
    # with_parameters' data reached every trial, whole.
    for row in rows:
        assert row["metrics"]["data_len"] == 100_000 and row["metrics"]["data_sum"] == sum(range(100_000)), row
    assert result["best_config"]["kind"] == "a"

    # The spec names the DAG file's code by the shipped package (by value) and the testkit's class by import path.
    assert spec["trainable"] == "airflow_tune_shipped:train" and spec["trainable_digest"].startswith("sha256:")
    assert spec["param_space"]["x"]["sample_from"].startswith("airflow_tune_shipped:sample_from_")
    shipped_stop, shipped_function, by_path = spec["stop"]
    assert shipped_stop["factory"].startswith("airflow_tune_shipped:stop_") and shipped_stop["args"] == {}
    assert shipped_function["factory"].startswith("airflow_tune_shipped:stop_")
    assert shipped_function["factory"] != shipped_stop["factory"]
    assert by_path == {"factory": "tune_testkit.stoppers:StopKindAt", "args": {"kind": "c", "after": 4}}

    # Refused before anything was submitted, each naming the field and what to write instead.
    refusals = {
        "numpy_space": ["param_space.w", "numpy.ndarray", ".tolist()"],
        "unpicklable_data": ["lock=", "cannot be pickled", "URI"],
        "param_stopper": ["stop[0].factory", "tune_testkit.stoppers:StopKindAt", "not written in the DAG file"],
    }
    for task_id, words in refusals.items():
        assert states[task_id] == "failed", (task_id, states)
        message = " ".join(str(error) for error in run.errors(task_id))
        assert all(word in message for word in words), (task_id, words, message)
        assert jobs_of(experiment("aft_code_objects", run_id_for(date), task_id)) == []
