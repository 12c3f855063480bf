"""Tune's own endings through RayTuneOperator, blocking and deferred, on the real stack (one ``dag.test()``): a spent
time budget is a successful task with the trials so far and their best (``num_samples=-1`` samples until the budget
ends it), ``fail_fast`` fails the task with the trial's own exception first; a rerun of the budget's experiment
returns its result. A job stopped by a signal stays "interrupted ... a rerun resumes" (tests/integration/
test_engine_restore.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import RESULT_FILE, RESULT_KEYS, SPEC_FILE, TRIALS_FILE, join_uri, manifest_uri
from tests.e2e.helpers import experiment, jobs_of, load_dag, run_dag
from tests.support import engine_jobs as jobs

pytestmark = pytest.mark.usefixtures("stack")

MODES = ("blocking", "deferred")
DAG_FILE = "outcome_cases.py"


def _unique_date() -> datetime:
    return datetime(2011, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


@pytest.fixture(scope="module")
def outcomes(stack: Any) -> Any:
    """The DAG's run: four independent tasks (a budget and fail_fast, each blocking and deferred)."""
    return run_dag(load_dag("aft_outcomes", DAG_FILE), logical_date=_unique_date())


def _task(task_id: str) -> Any:
    return load_dag("aft_outcomes", DAG_FILE).get_task(task_id)


def _space(task_id: str) -> dict[str, Any]:
    return dict(_task(task_id).param_space)


def _loss(row: dict[str, Any]) -> float | None:
    value = (row.get("metrics") or {}).get("loss")
    return value if isinstance(value, (int, float)) else None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_a_spent_time_budget_is_a_successful_task_with_the_best_trial_so_far(outcomes, mode):
    task_id = f"budget_{mode}"
    steps = _space(task_id)["steps"]
    assert outcomes.task_states()[task_id] == "success", outcomes.errors(task_id)
    result = outcomes.xcom(task_id)
    assert set(result) == set(RESULT_KEYS)
    assert result["experiment"] == experiment("aft_outcomes", outcomes.run_id, task_id)
    assert result["num_trials"] >= 1 and result["num_terminated"] == result["num_trials"], result
    assert result["num_errored"] == 0, result
    rows = storage.read_json(manifest_uri(result["experiment_uri"], TRIALS_FILE))["trials"]
    assert len(rows) == result["num_trials"] and all(r["status"] == "TERMINATED" for r in rows), rows
    # No trial could finish its steps in the budget: the budget ended every one that ran.
    reported = [r for r in rows if _loss(r) is not None]
    assert reported and all(r["metrics"]["training_iteration"] < steps for r in reported), rows
    best = min(reported, key=lambda r: _loss(r))  # type: ignore[arg-type, return-value]
    assert result["best_trial_id"] == best["trial_id"] and result["best_config"] == best["config"], (result, best)
    assert result["best_metrics"]["loss"] == best["metrics"]["loss"]
    # The best checkpoint is the best trial's, downloadable from S3.
    assert result["best_checkpoint_uri"].startswith(f"{result['experiment_uri']}/")
    state = jobs.read_checkpoint_state(result["best_checkpoint_uri"])
    assert state["x"] == best["config"]["x"], (state, best)
    [job] = jobs_of(result["experiment"])
    assert job["status"] == "SUCCEEDED"


@pytest.mark.timeout(120)
def test_a_rerun_after_a_spent_budget_returns_the_result(stack, outcomes):
    result = outcomes.xcom("budget_blocking")
    assert result is not None, outcomes.errors("budget_blocking")
    written = storage.read_json(manifest_uri(result["experiment_uri"], RESULT_FILE))
    assert written["status"] == "succeeded"
    spec = storage.read_json(manifest_uri(result["experiment_uri"], SPEC_FILE))
    logs, again = jobs.run_ok(stack, spec)
    assert "already finished" in logs and "restored experiment" not in logs, logs[-3000:]
    assert again["best_trial_id"] == result["best_trial_id"] and again["num_trials"] == result["num_trials"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_fail_fast_fails_the_task_with_the_trials_own_exception_first(outcomes, mode):
    task_id = f"fail_fast_{mode}"
    space = _space(task_id)
    assert outcomes.task_states()[task_id] == "failed"
    [error] = outcomes.errors(task_id)
    text = str(error)
    first = text.splitlines()[0]
    name = experiment("aft_outcomes", outcomes.run_id, task_id)
    assert first.startswith(f"ValueError: boom at step {space['fail_step']} of x={space['fail_x']} (trial "), text[
        :2000
    ]
    assert f"of experiment {name}; failure.fail_fast=true ended the experiment" in first, first
    assert "(full text: s3://" not in first and "; full text: s3://" in first and first.endswith("/error.txt)")
    assert "interrupted" not in text
    [job] = jobs_of(name)
    assert job["status"] == "FAILED"
    # Kept for diagnosis, not a result: the errored trial, and the other one, which fail_fast stopped.
    written = storage.read_json(manifest_uri(join_uri(_task(task_id).storage_path, name), RESULT_FILE))
    assert written["status"] == "failed" and written["num_errored"] == 1 and written["num_trials"] == 2, written
    [errored] = [t for t in written["trials"] if t["error"]]
    assert errored["config"]["x"] == space["fail_x"] and first.startswith(errored["error_summary"])
