"""The S3 endpoint stops answering for 20 s in the middle of an experiment with checkpoints (SIGSTOP of the S3 server,
by its pid): the task succeeds in its one try, every trial finishes, and the XCom is complete, in blocking and in
deferred mode."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.common.contract import RESULT_KEYS
from tests.e2e.helpers import (
    experiment,
    kill_dag_process,
    run_id_for,
    start_dag_process,
    stop_live_jobs,
    wait_for,
    wait_for_trials,
)
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.usefixtures("stack")
PAUSE_S = 20
STEPS = 6
MODES = ("blocking", "deferred")


def _xcom(dag_id: str, run_id: str, task_id: str) -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=run_id, dag_ids=dag_id, task_ids=task_id, key="return_value")
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def _try_number(dag_id: str, run_id: str) -> int:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id="tune").one()
        return int(ti.try_number)


def _steps(marker_dir: str) -> Counter:
    return Counter(m["x"] for m in read_markers(marker_dir, "step"))


@pytest.mark.timeout(600)
def test_a_20s_pause_of_s3_mid_experiment_is_ridden_out_in_one_try(stack, tmp_path):
    """A blocking and a deferred task, side by side through the same pause."""
    gate = tmp_path / "gate"
    gate.touch()  # every trial waits after its second step until the pause has begun
    runs = {}
    paused = False
    try:
        for mode in MODES:
            logical_date = datetime(2005, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
            marker_dir = str(tmp_path / mode / "marks")
            space = {
                "x": {"grid_search": [1, 3]},
                "steps": STEPS,
                "sleep": 1.0,
                "marker_dir": marker_dir,
                "gate": {"step": 1, "file": str(gate)},
            }
            log = tmp_path / f"{mode}.log"
            proc = start_dag_process(f"aft_pause_{mode}", logical_date, {"space": space}, log)
            runs[mode] = (f"aft_pause_{mode}", run_id_for(logical_date), marker_dir, log, proc)
            # One at a time into Airflow's database: two dag.test() runs that sync the DAGs folder at once collide.
            wait_for_trials(proc, log, marker_dir, "start")
        # Mid-experiment: every trial of both experiments has checkpointed two steps and waits at the gate.
        wait_for(
            lambda: all(min(_steps(run[2]).get(x, 0) for x in (1, 3)) >= 2 for run in runs.values()),
            300,
            "two steps of each trial of both experiments",
        )
        os.kill(stack.s3_pid, signal.SIGSTOP)
        paused = True
        steps_at_pause = {mode: _steps(run[2]) for mode, run in runs.items()}
        gate.unlink()  # the trials go on, and their next checkpoints meet the paused endpoint
        time.sleep(PAUSE_S)
        os.kill(stack.s3_pid, signal.SIGCONT)
        paused = False
        for mode, steps in steps_at_pause.items():
            assert min(steps.values()) < STEPS, f"{mode}: the experiment ended before the pause"
        for mode, (_, _, _, log, proc) in runs.items():
            assert proc.wait(timeout=200) == 0, (mode, log.read_text()[-5000:])
    finally:
        if paused:
            os.kill(stack.s3_pid, signal.SIGCONT)
        gate.unlink(missing_ok=True)
        for dag_id, run_id, _, _, proc in runs.values():
            kill_dag_process(proc)
            stop_live_jobs(experiment(dag_id, run_id))
    for mode, (dag_id, run_id, marker_dir, log, _) in runs.items():
        assert _try_number(dag_id, run_id) == 1, mode
        result = _xcom(dag_id, run_id, "tune")
        assert set(result) == set(RESULT_KEYS)
        assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["num_errored"] == 0, result
        assert result["best_config"]["x"] == 3 and result["best_metrics"]["training_iteration"] == STEPS, result
        assert result["best_checkpoint_uri"].startswith(result["experiment_uri"] + "/"), result
        assert _steps(marker_dir) == {1: STEPS, 3: STEPS}, mode  # every step of both trials ran, none twice
        assert Path(log).read_text().count("DAG_RUN_STATE success") == 1, mode
