"""A trial's output where users look, through ``dag.test()`` on the real stack (one deferred task): with the defaults,
each trial's stdout and stderr are in its folder in S3 (and no other file it wrote: ``sync_artifacts`` is off), the
task log shows the errored trial's printed lines, and the trials' folders and names come from functions written in
the DAG file (shipped by value)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common import storage
from tests.e2e.helpers import load_dag, run_dag

pytestmark = [pytest.mark.usefixtures("stack"), pytest.mark.timeout(300)]


def test_an_errored_trials_output_is_in_storage_and_in_the_task_log(stack: Any, capfd: Any) -> None:
    date = datetime(2012, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = run_dag(load_dag("aft_trial_output", "trial_output_cases.py"), logical_date=date)
    assert run.task_states()["tune"] == "success", run.errors("tune")
    result = run.xcom("tune")
    assert result["num_errored"] == 1 and result["num_terminated"] == 1, result
    experiment = result["experiment_uri"]
    folders = sorted(name for name in storage.glob_names(experiment, "dagfile_dir_x"))
    assert [f.split("_")[2] for f in folders] == ["x1", "x2"], storage.list_files(experiment)
    for x, folder in zip((1, 2), folders, strict=True):
        files = {uri.rsplit("/", 1)[-1] for uri in storage.list_files(f"{experiment}/{folder}")}
        assert {"stdout", "stderr"} <= files and "artifact.txt" not in files, files
        assert f"stdout of trial x={x}" in storage.read_bytes(f"{experiment}/{folder}/stdout").decode()
    # The names from the DAG file's trial_name_creator, in Tune's experiment state.
    state = storage.read_bytes(f"{experiment}/{storage.glob_names(experiment, 'experiment_state-')[-1]}").decode()
    assert "dagfile_x1" in state and "dagfile_x2" in state
    # The task log shows the errored trial's output, to its last line, and not the other trial's.
    # dag.test() writes the task log to the process's stdout.
    text = capfd.readouterr().out
    assert "last words of trial x=2" in text and "stderr of trial x=2" in text, text[-5000:]
    assert "stdout of trial x=1" not in text
