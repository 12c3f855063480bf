"""history.py, pure logic: downsampled curves, the bounded set of trials, rate-limited writes (fake clock, fake
trials, files on the local filesystem)."""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import history


def _spec(tmp_path, **fields) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "exp", "storage_path": str(tmp_path), "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "progress_interval_s": 10, **fields})


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trial(i: int, status: str = "RUNNING") -> SimpleNamespace:
    return SimpleNamespace(trial_id=f"t_{i:05d}", status=status, config={"lr": 0.001 * (i + 1), "i": i})


def _written(path) -> dict:
    return json.loads(path.read_text())


# -- one curve ---------------------------------------------------------------------------------------------------
def test_a_curve_of_10000_results_keeps_at_most_max_points_evenly_spaced_with_the_newest():
    curve = history.Curve("t", "RUNNING", {})
    for i in range(1, 10_001):
        curve.add(float(i), 1.0 / i, max_points=200)
        assert len(curve.points()) <= 200
    points = curve.points()
    xs = [p[0] for p in points]
    assert xs[0] == 1.0 and xs[-1] == 10_000.0  # the first and the newest
    assert xs == sorted(xs) and len(set(xs)) == len(xs)
    gaps = {b - a for a, b in zip(xs[:-2], xs[1:-1], strict=True)}  # the kept ones (not the newest) are evenly spaced
    assert gaps == {64.0}, gaps
    assert all(y == 1.0 / x for x, y in points)  # every point is a value the trial reported


def test_a_curve_cut_back_when_the_trial_restarts_from_an_earlier_checkpoint():
    curve = history.Curve("t", "RUNNING", {})
    for i in range(1, 11):
        curve.add(float(i), float(i), max_points=200)
    curve.add(6.0, 60.0, max_points=200)  # restored from the checkpoint after iteration 5
    curve.add(7.0, 70.0, max_points=200)
    assert curve.points() == [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0], [5.0, 5.0], [6.0, 60.0], [7.0, 70.0]]


# -- the callback --------------------------------------------------------------------------------------------------
def test_2000_trials_leave_a_bounded_file_and_bounded_memory(tmp_path):
    """2,000 trials, 8 at a time, 60 results each (120,000 results): the file holds at most 2 x max_trials curves of
    at most max_points points, the best ones; memory holds at most max_trials ended curves besides the live ones."""
    clock = _Clock()
    spec = _spec(tmp_path)
    cb = history.HistoryCallback(spec, clock=clock)
    cb.setup()
    trials = [_trial(i) for i in range(2000)]
    # loss of trial i ends at ((i * 7919) % 2000) / 1000 + 0.001: distinct finals, the best is i = 0.
    final = {t.trial_id: ((i * 7919) % 2000) / 1000 + 0.001 for i, t in enumerate(trials)}
    started = time.perf_counter()
    results = 0
    most_curves = 0
    for batch in range(0, 2000, 8):
        running = trials[batch : batch + 8]
        for t in running:
            cb.on_trial_start(0, trials, t)
        for step in range(1, 61):
            for t in running:
                loss = final[t.trial_id] + (60 - step) / 60
                cb.on_trial_result(0, trials, t, {"loss": loss, "training_iteration": step})
                results += 1
            clock.now += 0.5  # a result every 62 ms of fake time
        most_curves = max(most_curves, len(cb.curves))
        for t in running:
            t.status = "TERMINATED"
            cb.on_trial_complete(0, trials, t)
    elapsed = time.perf_counter() - started
    cb.on_experiment_end(trials)

    written = _written(tmp_path / "exp" / ".airflow_tune" / "history.json")
    size = (tmp_path / "exp" / ".airflow_tune" / "history.json").stat().st_size
    best10 = sorted(final, key=final.get)[:10]
    assert set(written["trials"]) == set(best10)  # no trial runs at the end
    assert all(len(t["points"]) == 60 for t in written["trials"].values())
    assert written["metric"] == "loss" and written["mode"] == "min"
    assert written["max_trials"] == history.MAX_TRIALS and written["max_points"] == history.MAX_POINTS
    assert most_curves <= history.MAX_TRIALS + 8
    # Rate-limited: one write per 10 s of the 7,500 s of fake time, plus the end.
    assert cb.writes <= 7_500 / 10 + 2
    print(
        f"\nhistory of 2,000 trials x 60 results: {elapsed / results * 1e6:.1f} us per result in the driver loop, "
        f"{cb.writes} writes, file {size / 1024:.1f} KiB, {len(written['trials'])} curves, at most {most_curves} "
        "curves in memory"
    )
    assert size < 256 * 1024


def test_long_running_trials_are_downsampled_and_running_ones_shown_beside_the_best(tmp_path):
    clock = _Clock()
    cb = history.HistoryCallback(_spec(tmp_path, mode="max"), clock=clock, max_trials=3, max_points=50)
    trials = [_trial(i) for i in range(12)]
    for t in trials[:8]:  # 8 finished: scores 0..7
        cb.on_trial_start(0, trials, t)
        cb.on_trial_result(0, trials, t, {"loss": float(t.config["i"]), "training_iteration": 1})
        t.status = "TERMINATED"
        cb.on_trial_complete(0, trials, t)
    for t in trials[8:]:  # 4 running, far behind, with long curves
        cb.on_trial_start(0, trials, t)
        for step in range(1, 1001):
            cb.on_trial_result(0, trials, t, {"loss": -1.0 - t.config["i"], "training_iteration": step})
    snap = cb.snapshot()
    assert list(snap["trials"])[:3] == ["t_00007", "t_00006", "t_00005"]  # best by max
    running = [k for k, v in snap["trials"].items() if v["status"] == "RUNNING"]
    assert running == ["t_00008", "t_00009", "t_00010"]  # at most max_trials running ones, the best first
    assert all(len(v["points"]) <= 50 for v in snap["trials"].values())
    assert snap["trials"]["t_00008"]["points"][-1] == [1000.0, -9.0]
    assert len(cb.curves) == 3 + 4  # ended ones beyond the best 3 were dropped


def test_writes_are_rate_limited_and_the_end_is_always_written(tmp_path):
    clock = _Clock()
    written: list[dict] = []
    cb = history.HistoryCallback(_spec(tmp_path), clock=clock, write=lambda uri, data: written.append(data))
    trials = [_trial(0)]
    cb.on_trial_start(0, trials, trials[0])
    assert len(written) == 1  # the first event writes at once
    for step in range(1, 101):
        clock.now += 0.05
        cb.on_trial_result(0, trials, trials[0], {"loss": 1.0 / step, "training_iteration": step})
    assert len(written) == 1
    clock.now += 10
    cb.on_trial_result(0, trials, trials[0], {"loss": 0.001, "training_iteration": 101})
    assert len(written) == 2 and len(written[-1]["trials"]["t_00000"]["points"]) == 101
    trials[0].status = "TERMINATED"
    cb.on_trial_complete(0, trials, trials[0])
    assert len(written) == 2  # a trial's end is not forced: the next tick or the end writes it
    cb.on_experiment_end(trials)
    assert len(written) == 3 and written[-1]["trials"]["t_00000"]["status"] == "TERMINATED"


def test_nan_metrics_are_kept_as_strict_json_and_ranked_last(tmp_path):
    clock = _Clock()
    cb = history.HistoryCallback(_spec(tmp_path), clock=clock, max_trials=1)
    trials = [_trial(0), _trial(1)]
    for t, values in zip(trials, ([1.0, math.nan], [5.0, 4.0]), strict=True):
        cb.on_trial_start(0, trials, t)
        for step, value in enumerate(values, start=1):
            cb.on_trial_result(0, trials, t, {"loss": value, "training_iteration": step})
    cb.on_trial_result(0, trials, trials[0], {"training_iteration": 3, "other": 1})  # no metric: no point
    cb.on_experiment_end(trials)
    path = tmp_path / "exp" / ".airflow_tune" / "history.json"
    text = path.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON token {c}"))
    assert list(cb.snapshot()["trials"]) == ["t_00001", "t_00000"]  # t_00000's last value is NaN: ranked last
    assert data["trials"]["t_00000"]["points"] == [[1.0, 1.0], [2.0, jsonsafe.NAN]]


def test_a_restored_experiment_keeps_the_curves_written_before(tmp_path):
    clock = _Clock()
    spec = _spec(tmp_path)
    first = history.HistoryCallback(spec, clock=clock)
    trials = [_trial(0), _trial(1)]
    for t in trials:
        first.on_trial_start(0, trials, t)
        for step in (1, 2, 3):
            first.on_trial_result(0, trials, t, {"loss": 10.0 - step, "training_iteration": step})
    trials[0].status = "TERMINATED"
    first.on_trial_complete(0, trials, trials[0])
    first.on_experiment_end(trials)  # the driver was stopped with trial 1 unfinished

    again = history.HistoryCallback(spec, clock=clock)
    again.setup()
    assert again.curves["t_00001"].status == "PENDING"  # not running until Tune resumes it
    resumed = _trial(1)
    again.on_trial_start(0, [resumed], resumed)
    again.on_trial_result(0, [resumed], resumed, {"loss": 6.0, "training_iteration": 4})
    again.on_experiment_end([resumed])
    data = json.loads(storage.read_bytes(again.uri))
    assert data["trials"]["t_00000"]["points"] == [[1.0, 9.0], [2.0, 8.0], [3.0, 7.0]]
    assert data["trials"]["t_00000"]["status"] == "TERMINATED"
    assert data["trials"]["t_00001"]["points"] == [[1.0, 9.0], [2.0, 8.0], [3.0, 7.0], [4.0, 6.0]]


def test_a_failing_write_does_not_fail_the_experiment(tmp_path, capsys):
    def broken(uri, data):
        raise OSError("endpoint down")

    cb = history.HistoryCallback(_spec(tmp_path), clock=_Clock(), write=broken)
    trials = [_trial(0)]
    cb.on_trial_start(0, trials, trials[0])
    cb.on_experiment_end(trials)
    assert cb.writes == 0
    out = capsys.readouterr().out
    assert "could not write" in out and "endpoint down" in out
