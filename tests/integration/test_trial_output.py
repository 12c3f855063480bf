"""A trial's output and files in storage, and its name, as a real Ray job on the local stack: ``log_to_file``'s files
(here Tune's pair form) in each trial's folder in S3, an errored trial's last printed line included; a file the trial
wrote in its working directory synced with ``sync_artifacts``; the folders and names from ``trial_dirname_creator`` and
``trial_name_creator`` (import paths on the cluster). The defaults (output files, no artifacts) and a creator shipped by
value from a DAG file are in tests/e2e/test_trial_output.py."""

from __future__ import annotations

import pytest

from airflow_tune.common import storage
from tests.support import engine_jobs as jobs

pytestmark = pytest.mark.timeout(240)


def test_output_artifacts_and_names_reach_storage(stack):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("trial-output"),
        "tune_testkit.output:chatty",
        param_space={"x": {"grid_search": [1, 2]}, "fail_at": 2},
        log_to_file=["out.log", "err.log"],
        sync_artifacts=True,
        trial_name_creator="tune_testkit.output:trial_name",
        trial_dirname_creator="tune_testkit.output:trial_dirname",
    )
    final, logs, result = jobs.run(stack, spec)
    assert final == "SUCCEEDED", logs[-4000:]
    assert result is not None and result["num_errored"] == 1 and result["num_terminated"] == 1, result
    experiment = result["experiment_uri"]
    rows = {row["config"]["x"]: row for row in result["trials"]}
    for x, row in rows.items():
        folder = row["path"]
        # The trial's folder is the one trial_dirname_creator named, inside the experiment.
        assert folder.startswith(f"{experiment}/dir_x{x}_{row['trial_id']}"), folder
        out = storage.read_bytes(f"{folder}/out.log").decode()
        err = storage.read_bytes(f"{folder}/err.log").decode()
        assert f"stdout of trial x={x}" in out and f"stderr of trial x={x}" not in out, out
        assert f"stderr of trial x={x}" in err, err
        assert storage.read_bytes(f"{folder}/artifact.txt").decode() == f"artifact of trial x={x}\n"
    # The errored trial's output is there to its last line, printed just before it raised.
    assert "last words of trial x=2" in storage.read_bytes(f"{rows[2]['path']}/out.log").decode()
    # trial_name_creator named the trials: Tune keeps the names in its experiment state.
    state_files = storage.glob_names(experiment, "experiment_state-")
    state = storage.read_bytes(f"{experiment}/{state_files[-1]}").decode()
    assert "named_x1" in state and "named_x2" in state, state[:2000]
