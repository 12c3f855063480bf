"""One DAG of Tune's own endings, each in the blocking and the deferred mode: a time budget that is spent while
trials run (with ``num_samples=-1``: sample until the budget ends it), and ``fail_fast`` after one trial raises."""

from __future__ import annotations

import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_tune.operators.tune import RayTuneOperator

TESTKIT = str(Path(__file__).resolve().parents[2] / "support" / "tune_testkit")
STORAGE = os.environ.get("AIRFLOW_TUNE_STORAGE_URI", "s3://airflow-tune/experiments")
#: Trials report every 0.2 s and would run for minutes: only the budget ends them. The budget counts from the
#: experiment's start, so it leaves room for a trial's actor to start on a loaded 2-core machine and report.
BUDGET_S = 15
BUDGET_STEPS = 3000
FAIL_STEP = 2

with DAG("aft_outcomes", schedule=None, catchup=False, tags=["test"]) as outcomes:
    for _mode in ("blocking", "deferred"):
        RayTuneOperator(
            task_id=f"budget_{_mode}",
            trainable="tune_testkit.airflow_cases:stepper",
            storage_path=STORAGE,
            metric="loss",
            mode="min",
            param_space={"x": {"uniform": [0, 5]}, "steps": BUDGET_STEPS, "sleep": 0.2},
            num_samples=-1,
            max_concurrent_trials=2,
            time_budget_s=BUDGET_S,
            checkpoint={"num_to_keep": 2},
            py_modules=[TESTKIT],
            progress_interval_s=1.0,
            poll_interval=0.5,
            deferrable=_mode == "deferred",
        )
        RayTuneOperator(
            task_id=f"fail_fast_{_mode}",
            trainable="tune_testkit.outcomes:fails_at",
            storage_path=STORAGE,
            metric="loss",
            mode="min",
            # x=3 would run for a minute; fail_fast stops it when x=1 raises at its step 2.
            param_space={"x": {"grid_search": [1, 3]}, "fail_x": 1, "fail_step": FAIL_STEP, "steps": 300, "sleep": 0.2},
            failure={"fail_fast": True},
            py_modules=[TESTKIT],
            progress_interval_s=1.0,
            poll_interval=0.5,
            deferrable=_mode == "deferred",
        )
