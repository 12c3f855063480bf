"""The Airflow side's own share of a tune task: the task's wall time, as Airflow records it (its start and end
dates), against its Ray job's, as Ray records it (the job's start and end times), blocking and deferred, on the
4-trial grid of :mod:`benchmarks.job_overhead`, each a real ``dag.test()`` of the DAGs in ``benchmarks/dags`` (the
deferred one runs its trigger as ``dag.test()`` does, in the same process). What the task adds is its checks and the
submission before the job starts, and the wait's lag and the reading of the result after it ends."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: The DAGs folder of the benchmarks' Airflow (``dag.test()`` finds a DAG by parsing its folder).
DAGS = Path(__file__).resolve().parent / "dags"


def _dag(deferrable: bool) -> Any:
    name = "bench_airflow_side_dags"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, DAGS / "airflow_side.py")
        assert spec is not None and spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return getattr(module, f"bench_airflow_side_{'deferred' if deferrable else 'blocking'}")


def run_once(deferrable: bool) -> dict[str, float]:
    """One DAG run's figures, in seconds: the task's, its job's, the task's before the job started and after it
    ended."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from airflow_tune.hooks.ray import RayHook

    dag = _dag(deferrable)
    dag_run = dag.test(logical_date=datetime.now(tz=timezone.utc))
    with create_session() as session:
        (ti,) = dag_run.get_task_instances(session=session)
        if str(ti.state) != "success":
            raise RuntimeError(f"benchmark DAG run's tune task ended {ti.state}")
        started, ended = ti.start_date.timestamp(), ti.end_date.timestamp()
        row = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag.dag_id, task_ids="tune", key="return_value")
        ).first()
        result = XComModel.deserialize_value(row)
    job = RayHook().get_conn().get_job_info(result["job_id"])
    job_started, job_ended = int(job["start_time"]) / 1000, int(job["end_time"]) / 1000
    return {
        "task": ended - started,
        "job": job_ended - job_started,
        "before": job_started - started,
        "after": ended - job_ended,
    }


def main(stack_state: Any = None, repeats: int = 3) -> dict[str, float]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack with Airflow"
    runs: dict[str, list[dict[str, float]]] = {"blocking": [], "deferred": []}
    for mode in runs:  # each mode once unmeasured: the process's first run imports and parses what later ones reuse
        run_once(deferrable=mode == "deferred")
    for _ in range(repeats):
        for mode in runs:
            runs[mode].append(run_once(deferrable=mode == "deferred"))
    print(f"The Airflow side's share of a tune task (4-trial grid, dag.test(), real Ray head; median of {repeats})")
    added: dict[str, float] = {}
    for mode, figures in runs.items():

        def median(what: str, figures: list[dict[str, float]] = figures) -> float:
            return statistics.median(f[what] for f in figures)

        added[mode] = statistics.median(f["task"] - f["job"] for f in figures)
        print(
            f"  {mode:9s} task {median('task'):6.2f} s   its Ray job {median('job'):6.2f} s   the Airflow side adds "
            f"{added[mode]:5.2f} s ({median('before'):.2f} s before the job, {median('after'):.2f} s after it)"
        )
    return added
