"""The S3 endpoint stops answering for 20 s in the middle of an experiment with checkpoints (SIGSTOP of the S3 server,
by its pid): the task succeeds in its one try, every trial finishes, and the XCom is complete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.contract import RESULT_KEYS
from tests.e2e.helpers import RUN_DAG, experiment, run_id_for, stop_live_jobs, wait_for
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.usefixtures("stack")
PAUSE_S = 20


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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["blocking", "deferred"])
def test_a_20s_pause_of_s3_mid_experiment_is_ridden_out_in_one_try(stack, tmp_path, mode):
    dag_id = f"aft_pause_{mode}"
    logical_date = datetime(2005, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)
    run_id = run_id_for(logical_date)
    marker_dir = str(tmp_path / "marks")
    space = {"x": {"grid_search": [1, 3]}, "steps": 8, "sleep": 1.0, "marker_dir": marker_dir}
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(RUN_DAG), dag_id, logical_date.isoformat(), json.dumps({"space": space})],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    paused = False
    try:
        # Mid-experiment: both trials have checkpointed a few steps and have more to go.
        wait_for(lambda: min(_steps(marker_dir).get(x, 0) for x in (1, 3)) >= 2, 120, "two steps of each trial")
        os.kill(stack.s3_pid, signal.SIGSTOP)
        paused = True
        steps_at_pause = _steps(marker_dir)
        time.sleep(PAUSE_S)
        os.kill(stack.s3_pid, signal.SIGCONT)
        paused = False
        assert min(steps_at_pause.values()) < 8, "the experiment ended before the pause"
        assert proc.wait(timeout=200) == 0, log.read_text()[-5000:]
    finally:
        if paused:
            os.kill(stack.s3_pid, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        stop_live_jobs(experiment(dag_id, run_id))
    assert _try_number(dag_id, run_id) == 1
    result = _xcom(dag_id, run_id, "tune")
    assert set(result) == set(RESULT_KEYS)
    assert result["num_trials"] == 2 and result["num_terminated"] == 2 and result["num_errored"] == 0, result
    assert result["best_config"]["x"] == 3 and result["best_metrics"]["training_iteration"] == 8, result
    assert result["best_checkpoint_uri"].startswith(result["experiment_uri"] + "/"), result
    assert _steps(marker_dir) == {1: 8, 3: 8}  # every step of both trials ran, none twice
    assert Path(log).read_text().count("DAG_RUN_STATE success") == 1
