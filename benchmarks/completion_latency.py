"""How long after a Ray job ends the waiting task sees it: the deferred trigger (the shared, event-driven poll), the
blocking wait (defaults), and the old trigger loop (a shared list up to ``poll_interval`` old, then a sleep of
``poll_interval``, at the old default of 5 s), each on the same short real experiments."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

from benchmarks.engine_jobs import submit


def _submit(state: Any) -> tuple[str, str]:
    name = f"bench-latency-{uuid.uuid4().hex[:8]}"
    spec = {
        "trainable": "tune_testkit.functions:quadratic",
        "name": name,
        "storage_path": state.storage_uri,
        "metric": "loss",
        "mode": "min",
        "param_space": {"x": {"grid_search": [3]}, "steps": 2},
    }
    return submit(state, spec)


def _lateness(job_id: str, seen_at: float) -> float:
    from airflow_tune.hooks.ray import RayHook

    end_ms = RayHook().get_job_info(job_id)["end_time"]
    return seen_at - end_ms / 1000.0


async def _deferred(job_id: str, uri: str) -> float:
    from airflow_tune.triggers.tune import RayTuneTrigger

    async for _ in RayTuneTrigger(job_id=job_id, experiment_uri=uri, log_progress=False).run():
        return time.time()
    raise AssertionError("no event")


async def _old_loop(job_id: str, poll_interval: float = 5.0) -> float:
    from airflow_tune.common.contract import TERMINAL_STATUSES
    from airflow_tune.hooks.ray import RayHook

    hook = RayHook()
    while True:
        info = await hook.async_job_status(job_id, max_age=poll_interval)
        if info and info["status"] in TERMINAL_STATUSES:
            return time.time()
        await asyncio.sleep(poll_interval)


def _blocking(job_id: str, uri: str) -> float:
    from airflow_tune.operators.tune import RayTuneOperator

    op = RayTuneOperator(task_id="bench", trainable="m:f", storage_path="s3://bkt/x", metric="loss", mode="min")
    op.log.disabled = True
    op.wait_blocking(job_id, uri)
    return time.time()


def main(stack_state: Any = None, runs: int = 5) -> dict[str, float]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    waits = {
        "old trigger loop, poll_interval 5 s (baseline)": lambda j, u: asyncio.run(_old_loop(j)),
        "deferred: shared event-driven poll (ours)": lambda j, u: asyncio.run(_deferred(j, u)),
        "blocking: poll_interval 1 s (ours)": _blocking,
    }
    found: dict[str, list[float]] = {name: [] for name in waits}
    for _ in range(runs):
        for name, wait in waits.items():  # interleaved
            job_id, uri = _submit(stack_state)
            found[name].append(_lateness(job_id, wait(job_id, uri)))
    medians = {name: statistics.median(values) for name, values in found.items()}
    base = medians["old trigger loop, poll_interval 5 s (baseline)"]
    print(f"Time from a Ray job's end to the waiting task seeing it (median of {runs}, real Ray head)")
    for name, value in medians.items():
        print(f"  {name:<48} {value:6.2f} s   x{value / base:.2f} of baseline")
    return medians
