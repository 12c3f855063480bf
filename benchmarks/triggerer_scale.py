"""A triggerer watching many experiments: N real ``RayTuneTrigger``s in one event loop, as in a triggerer, against a
real Ray head running real experiments (which print progress to their logs and write ``progress.json`` to S3).

Ours: the shared, event-driven status poll and progress from ``progress.json`` (read when it changes). Baseline: the
same status poll, with each trigger reading its job's whole log every ``log_interval`` for its progress lines (what
triggers did before). Measured over one window each: requests to the dashboard per second, S3 reads per second, the
event loop's lag (p99 of a 10 ms ticker's overshoot), Python memory per trigger, and lines printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.engine_jobs import submit

LOG_INTERVAL = 10.0


def _start_experiments(state: Any, count: int, seconds: float) -> list[tuple[str, str]]:
    """``count`` long experiments (one trial each, a report every 0.25 s); their (job id, experiment URI)."""
    from airflow_tune.common import storage

    out = []
    for _ in range(count):
        name = f"bench-triggers-{uuid.uuid4().hex[:8]}"
        spec = {
            "trainable": "tune_testkit.functions:quadratic",
            "name": name,
            "storage_path": state.storage_uri,
            "metric": "loss",
            "mode": "min",
            "param_space": {"x": {"grid_search": [3]}, "steps": int(seconds / 0.25), "sleep": 0.25},
            "progress_interval_s": 1.0,
        }
        out.append(submit(state, spec))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if all(storage.exists(f"{uri}/.airflow_tune/progress.json") for _, uri in out):
            return out
        time.sleep(1)
    raise RuntimeError("the benchmark's experiments did not start writing progress within 90 s")


class _Counters:
    def __init__(self) -> None:
        self.dashboard = 0
        self.dashboard_bytes = 0
        self.s3 = 0
        self.lines = 0


@contextlib.contextmanager
def _counting(counters: _Counters) -> Any:
    from airflow_tune.common import storage
    from airflow_tune.hooks.transport import AsyncTransport

    get_json, read_if_changed = AsyncTransport.get_json, storage.read_json_if_changed

    async def counting_get_json(self: Any, path: str, **kwargs: Any) -> Any:
        counters.dashboard += 1
        data = await get_json(self, path, **kwargs)
        if isinstance(data, dict) and "logs" in data:
            counters.dashboard_bytes += len(data["logs"])
        return data

    def counting_read(uri: str, seen: Any) -> Any:
        counters.s3 += 1
        return read_if_changed(uri, seen)

    AsyncTransport.get_json = counting_get_json  # type: ignore[method-assign]
    storage.read_json_if_changed = counting_read
    try:
        yield
    finally:
        AsyncTransport.get_json = get_json  # type: ignore[method-assign]
        storage.read_json_if_changed = read_if_changed


def _baseline_trigger_class() -> type:
    """A trigger that reads its job's whole log every ``log_interval`` for the progress lines (the old way)."""
    from airflow_tune.common.contract import progress_lines
    from airflow_tune.triggers.tune import RayTuneTrigger

    class LogReadingTrigger(RayTuneTrigger):
        printed = 0

        async def _log_progress(self, follower: Any) -> None:
            try:
                logs = await self._hook_for_logs.async_get_job_logs(self.job_id)
            except Exception:
                return
            lines = progress_lines(logs)
            for line in lines[self.printed :]:
                self.log.info("%s", line)
            self.printed = len(lines)

        @contextlib.asynccontextmanager
        async def _bound(self, hook: Any) -> AsyncIterator[None]:
            self._hook_for_logs = hook
            yield

    return LogReadingTrigger


async def _window(triggers: list[Any], counters: _Counters, seconds: float) -> dict[str, float]:
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - start - 0.01)

    async def follow(trigger: Any) -> None:
        hook = trigger._hook()
        if hasattr(trigger, "_bound"):
            async with trigger._bound(hook):
                async for _ in trigger.run():
                    return
        else:
            async for _ in trigger.run():
                return

    for trigger in triggers:
        trigger.log.info = lambda *args, **kwargs: setattr(counters, "lines", counters.lines + 1)  # type: ignore
        trigger.log.warning = lambda *args, **kwargs: None  # type: ignore
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tasks = [asyncio.create_task(follow(t)) for t in triggers]
    tick = asyncio.create_task(ticker())
    await asyncio.sleep(2.0)  # everyone started
    counters.dashboard = counters.s3 = counters.lines = counters.dashboard_bytes = 0
    lags.clear()
    await asyncio.sleep(seconds)
    measured = {
        "dashboard_rps": counters.dashboard / seconds,
        "dashboard_mb_s": counters.dashboard_bytes / seconds / 1e6,
        "s3_rps": counters.s3 / seconds,
        "lag_p99_ms": statistics.quantiles(lags, n=100)[98] * 1000 if len(lags) > 100 else float("nan"),
        "kb_per_trigger": (tracemalloc.get_traced_memory()[0] - before) / len(triggers) / 1024,
        "lines_per_s": counters.lines / seconds,
    }
    tracemalloc.stop()
    stop.set()
    for task in [*tasks, tick]:
        task.cancel()
    await asyncio.gather(*tasks, tick, return_exceptions=True)
    return measured


def _triggers(cls: type, experiments: list[tuple[str, str]], n: int) -> list[Any]:
    return [
        cls(
            job_id=experiments[i % len(experiments)][0],
            experiment_uri=experiments[i % len(experiments)][1],
            log_interval=LOG_INTERVAL,
            poll_interval=5.0,
        )
        for i in range(n)
    ]


def main(stack_state: Any = None, counts: tuple[int, ...] = (1000, 3000), seconds: float = 30.0) -> dict[str, Any]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.triggers.tune import RayTuneTrigger

    experiments = _start_experiments(stack_state, 2, seconds=400)
    results: dict[str, Any] = {}
    try:
        baseline_cls = _baseline_trigger_class()
        for label, cls, n in [
            ("per-trigger log reads (baseline)", baseline_cls, counts[0]),
            *((f"ours, {n} triggers", RayTuneTrigger, n) for n in counts),
        ]:
            counters = _Counters()
            with _counting(counters):
                results[label] = asyncio.run(_window(_triggers(cls, experiments, n), counters, seconds))
            results[label]["triggers"] = n
    finally:
        hook = RayHook()
        for job_id, _ in experiments:
            with contextlib.suppress(Exception):
                hook.stop_job(job_id)
    print(f"A triggerer watching experiments, progress on ({seconds:.0f} s windows, 2 live experiments, real Ray head)")
    print(
        f"  {'':<34}{'triggers':>9}{'dashboard req/s':>17}{'MB/s':>7}{'S3 req/s':>10}"
        f"{'loop lag p99':>14}{'KB/trigger':>12}{'lines/s':>9}"
    )
    for label, r in results.items():
        print(
            f"  {label:<34}{r['triggers']:>9}{r['dashboard_rps']:>17.2f}{r['dashboard_mb_s']:>7.2f}{r['s3_rps']:>10.1f}"
            f"{r['lag_p99_ms']:>11.1f} ms{r['kb_per_trigger']:>12.1f}{r['lines_per_s']:>9.1f}"
        )
    return results
