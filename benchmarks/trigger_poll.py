"""Triggerer load on the Ray dashboard: N triggers checking job status through the shared poll vs one GET each.

Runs against a real local Ray head with a few live jobs. Counts the HTTP requests the dashboard receives and the wall
time of each round of N status checks (all N run concurrently, as in a triggerer's event loop).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

POLL_INTERVAL = 1.0


async def _round(calls: list[Any]) -> float:
    start = time.perf_counter()
    await asyncio.gather(*calls)
    return time.perf_counter() - start


async def _measure(job_ids: list[str], triggers: int, rounds: int) -> dict[str, dict[str, float]]:
    from airflow_tune.hooks.ray import RayHook
    from airflow_tune.hooks.transport import AsyncTransport

    counted = {"n": 0}
    original = AsyncTransport.get_json

    async def counting_get_json(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted["n"] += 1
        return await original(self, *args, **kwargs)

    AsyncTransport.get_json = counting_get_json  # type: ignore[method-assign]
    try:
        hooks = [RayHook() for _ in range(triggers)]
        for hook in hooks:
            await hook.aget_endpoint()
        out: dict[str, dict[str, float]] = {}
        for name in ("one GET per trigger (baseline)", "shared poll (ours)"):
            counted["n"] = 0
            times = []
            for _ in range(rounds):
                # Each round is one poll interval: the shared list is older than max_age by the next round.
                await asyncio.sleep(POLL_INTERVAL * 1.1)
                if name.startswith("shared"):
                    calls = [
                        h.async_job_status(job_ids[i % len(job_ids)], max_age=POLL_INTERVAL)
                        for i, h in enumerate(hooks)
                    ]
                else:
                    calls = [h.async_get_job_info(job_ids[i % len(job_ids)]) for i, h in enumerate(hooks)]
                times.append(await _round(calls))
            out[name] = {"requests_per_round": counted["n"] / rounds, "seconds_per_round": statistics.median(times)}
        return out
    finally:
        AsyncTransport.get_json = original  # type: ignore[method-assign]


def main(stack_state: Any = None, triggers: int = 100, rounds: int = 5) -> dict[str, dict[str, float]]:
    from ray.job_submission import JobSubmissionClient

    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    client = JobSubmissionClient(stack_state.dashboard_url, headers=stack_state.auth_headers)
    job_ids = [
        client.submit_job(
            entrypoint="python -c 'import time; time.sleep(120)'", submission_id=f"bench-poll-{i}-{time.time_ns()}"
        )
        for i in range(3)
    ]
    try:
        results = asyncio.run(_measure(job_ids, triggers, rounds))
    finally:
        for job_id in job_ids:
            client.stop_job(job_id)
    base = results["one GET per trigger (baseline)"]
    print(f"Dashboard load of {triggers} triggers checking status (median of {rounds} rounds, real Ray head)")
    for name, r in results.items():
        print(
            f"  {name:<32} {r['requests_per_round']:6.0f} requests/round  {r['seconds_per_round'] * 1000:7.0f} ms/round"
            f"  x{r['requests_per_round'] / base['requests_per_round']:.3f} requests,"
            f" x{r['seconds_per_round'] / base['seconds_per_round']:.2f} time of baseline"
        )
    return results
