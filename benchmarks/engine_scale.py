"""How the engine's cost grows with an experiment: N trivial trials (one result each, actors reused) through the
engine and as a plain Tune driver script, side by side on one stack (:mod:`benchmarks.side_by_side`), at each size of
a sweep; per size the wall times, their ratio (plain/ours: above 1 the engine is faster), the CPU seconds per trial of
each side's driver and trial workers; over the sweep each side's marginal milliseconds per trial; and the sizes of the
manifests the Airflow side reads at the largest size.

Pairs alternate their order (plain first, then ours first), so drift on the machine hits both alike."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.side_by_side import TRIVIAL, Run, pair


def measure(state: Any, trials: int, pairs: int) -> dict[str, Any]:
    plain: list[Run] = []
    ours: list[Run] = []
    for i in range(pairs):
        p, o = pair(state, TRIVIAL, trials, ours_first=bool(i % 2))
        plain.append(p)
        ours.append(o)
        print(
            f"  {trials} trials, pair {i + 1}/{pairs}: plain {p.wall_s:.1f} s, ours {o.wall_s:.1f} s, "
            f"plain/ours {p.wall_s / o.wall_s:.2f}",
            flush=True,
        )

    def median(runs: list[Run], what: str) -> float:
        return statistics.median(getattr(r, what) for r in runs)

    return {
        "trials": trials,
        "plain_s": median(plain, "wall_s"),
        "ours_s": median(ours, "wall_s"),
        "speed": statistics.median(p.wall_s / o.wall_s for p, o in zip(plain, ours, strict=True)),
        "plain_driver_cpu_ms": 1000 * median(plain, "driver_cpu_s") / trials,
        "ours_driver_cpu_ms": 1000 * median(ours, "driver_cpu_s") / trials,
        "plain_trials_cpu_ms": 1000 * median(plain, "trials_cpu_s") / trials,
        "ours_trials_cpu_ms": 1000 * median(ours, "trials_cpu_s") / trials,
        "experiment_uri": ours[-1].experiment_uri,
    }


def main(stack_state: Any = None, sizes: tuple[int, ...] = (100, 500, 2000), pairs: int = 2) -> list[dict[str, Any]]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    from airflow_tune.common import storage
    from airflow_tune.common.contract import PROGRESS_FILE, RESULT_FILE, TRIALS_FILE, manifest_uri

    rows = [measure(stack_state, n, pairs if n < 2000 else 1) for n in sizes]
    print(f"Trivial trials, S3 storage, real Ray head (medians of {pairs} pairs in alternating order; 1 at 2000)")
    print(
        "  trials   plain s    ours s   plain/ours   driver CPU ms/trial (plain, ours)   "
        "trial workers CPU ms/trial (plain, ours)"
    )
    for r in rows:
        print(
            f"  {r['trials']:6d}  {r['plain_s']:8.1f}  {r['ours_s']:8.1f}   {r['speed']:10.2f}   "
            f"{r['plain_driver_cpu_ms']:15.1f} {r['ours_driver_cpu_ms']:8.1f}   "
            f"{r['plain_trials_cpu_ms']:25.1f} {r['ours_trials_cpu_ms']:8.1f}"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        span = last["trials"] - first["trials"]
        print(
            f"  marginal cost per trial ({first['trials']} to {last['trials']}): plain "
            f"{1000 * (last['plain_s'] - first['plain_s']) / span:.0f} ms, ours "
            f"{1000 * (last['ours_s'] - first['ours_s']) / span:.0f} ms"
        )
    uri = rows[-1]["experiment_uri"]
    sizes_kb = {
        name: len(storage.read_bytes(manifest_uri(uri, name))) / 1024
        for name in (PROGRESS_FILE, RESULT_FILE, TRIALS_FILE)
    }
    print(
        f"  manifests at {rows[-1]['trials']} trials: progress.json {sizes_kb[PROGRESS_FILE]:.1f} KB, result.json "
        f"(read by Airflow) {sizes_kb[RESULT_FILE]:.1f} KB, trials.json {sizes_kb[TRIALS_FILE]:.0f} KB"
    )
    return rows
