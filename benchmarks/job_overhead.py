"""A user's first experiment (a 4-trial grid of five steps each) through airflow-tune's engine (spec checks,
progress, seals, the result manifests on S3) vs the same as a plain Tune driver script (the baseline), side by side
on one stack (:mod:`benchmarks.side_by_side`), interleaved."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.side_by_side import GRID, pair


def main(stack_state: Any = None, repeats: int = 3) -> dict[str, float]:
    assert stack_state is not None, "run through `python -m benchmarks`, which starts a local stack"
    ours, plain = [], []
    for i in range(repeats):  # interleaved, in turn first, so drift on the machine hits both alike
        p, o = pair(stack_state, GRID, 1, ours_first=bool(i % 2))
        plain.append(p.wall_s)
        ours.append(o.wall_s)
    result = {"plain_s": statistics.median(plain), "ours_s": statistics.median(ours)}
    result["ratio"] = result["ours_s"] / result["plain_s"]
    print(f"4-trial grid experiment, S3 storage, real Ray head (median of {repeats}, interleaved)")
    print(f"  plain Tune driver script (baseline)         {result['plain_s']:6.1f} s")
    print(
        f"  airflow-tune engine as a Ray job            {result['ours_s']:6.1f} s   x{result['ratio']:.2f} of baseline"
    )
    return result
