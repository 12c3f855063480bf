"""Faults a production run meets, on the real stack: trainables that crash at random (retried from their
checkpoints), and a Ray dashboard that stops answering for 30 s while a task waits (blocking and deferred)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from datetime import datetime, timezone
from typing import Any

import psutil
import pytest

from airflow_tune.common.contract import RESULT_KEYS
from tests.e2e.helpers import (
    experiment,
    kill_dag_process,
    load_dag,
    run_dag,
    run_id_for,
    start_dag_process,
    stop_live_jobs,
    wait_for_trials,
)
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.usefixtures("stack")


def _date() -> datetime:
    return datetime(2006, 1, 1, tzinfo=timezone.utc).replace(microsecond=uuid.uuid4().int % 1_000_000)


def _counts(marker_dir: str, event: str) -> Counter:
    return Counter(m["x"] for m in read_markers(marker_dir, event))


@pytest.mark.timeout(300)
def test_trainables_that_crash_at_random_finish_from_their_checkpoints(tmp_path):
    marker_dir = str(tmp_path / "marks")
    xs = [1, 2, 3, 4]
    space = {"x": {"grid_search": xs}, "steps": 8, "sleep": 0.1, "marker_dir": marker_dir}
    run = run_dag(load_dag("aft_crashy"), {"space": space}, logical_date=_date())
    assert run.state == "success", run.errors("tune")
    assert run.try_numbers()["tune"] == 1
    result = run.xcom("tune")
    assert set(result) == set(RESULT_KEYS)
    assert (result["num_trials"], result["num_terminated"], result["num_errored"]) == (4, 4, 0), result
    assert result["best_config"]["x"] == 3 and result["best_metrics"]["training_iteration"] == 8
    crashes, resumes = _counts(marker_dir, "crash"), _counts(marker_dir, "resume")
    assert sum(crashes.values()) >= 4, crashes  # about 30% of the steps crashed
    for x in xs:
        # Each crash was retried from the trial's last checkpoint (never from scratch), and every trial ended once.
        assert _counts(marker_dir, "start")[x] == 1 and _counts(marker_dir, "end")[x] == 1, x
        assert resumes[x] == crashes[x], (x, crashes, resumes)
        steps = sorted(m["step"] for m in read_markers(marker_dir, "step") if m["x"] == x)
        assert steps == list(range(8)), (x, steps)  # no step ran twice: each resume started after its checkpoint


def _dashboard_pid(stack: Any) -> int:
    """Our own Ray head's dashboard process (a child of the head this test session started)."""
    for child in psutil.Process(stack.ray_pid).children(recursive=True):
        if any(part.endswith("dashboard/dashboard.py") for part in child.cmdline()):
            return int(child.pid)
    raise LookupError("no dashboard process under the session's Ray head")


@pytest.mark.timeout(600)
def test_a_dashboard_that_stops_answering_for_30s_is_waited_out(stack, tmp_path):
    """A blocking and a deferred task, side by side through the same pause."""
    gate = tmp_path / "gate"
    gate.touch()  # every trial waits after its first step until the pause has begun: both tasks wait through it
    runs = {}
    dashboard = _dashboard_pid(stack)
    paused = False
    try:
        for mode in ("blocking", "deferred"):
            logical_date = _date()
            marker_dir = str(tmp_path / mode / "marks")
            space = {
                "x": {"grid_search": [1, 3]},
                "steps": 8,
                "sleep": 1.0,
                "marker_dir": marker_dir,
                "gate": {"step": 0, "file": str(gate)},
            }
            log = tmp_path / f"{mode}.log"
            proc = start_dag_process(f"aft_dashboard_pause_{mode}", logical_date, {"space": space}, log)
            runs[mode] = (f"aft_dashboard_pause_{mode}", run_id_for(logical_date), marker_dir, log, proc)
            # One at a time into Airflow's database: two dag.test() runs that sync the DAGs folder at once collide.
            wait_for_trials(proc, log, marker_dir, "step")
        os.kill(dashboard, signal.SIGSTOP)
        paused = True
        gate.unlink()
        time.sleep(30)
        os.kill(dashboard, signal.SIGCONT)
        paused = False
        for mode, (_, _, _, log, proc) in runs.items():
            assert proc.wait(timeout=200) == 0, (mode, log.read_text()[-5000:])
    finally:
        if paused:
            os.kill(dashboard, signal.SIGCONT)
        gate.unlink(missing_ok=True)
        for dag_id, run_id, _, _, proc in runs.values():
            kill_dag_process(proc)
            stop_live_jobs(experiment(dag_id, run_id))
    for mode, (_, _, marker_dir, log, _) in runs.items():
        assert log.read_text().count("DAG_RUN_STATE success") == 1, mode
        assert _counts(marker_dir, "end") == {1: 1, 3: 1}, mode
