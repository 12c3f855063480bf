"""A user's first DAG: trainables defined in the DAG file and passed as objects, on the real local stack."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from tests.e2e.helpers import load_dag, run_dag

pytestmark = pytest.mark.usefixtures("stack")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["blocking", "deferred"])
def test_function_and_class_trainables_defined_in_the_dag_file_run_by_value(mode):
    date = datetime(2002, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run = run_dag(load_dag(f"aft_inline_{mode}", "inline_trainables.py"), logical_date=date)
    assert run.state == "success", (run.task_states(), run.errors("tune_function"), run.errors("tune_class"))
    for task_id in ("tune_function", "tune_class"):
        result = run.xcom(task_id)
        assert set(result) == set(RESULT_KEYS)
        assert result["best_config"] == {"x": 3, "steps": 2}, (task_id, result)
        assert result["num_trials"] == 3 and result["num_terminated"] == 3 and result["num_errored"] == 0
        assert result["best_metrics"]["loss"] == pytest.approx(0.5)
