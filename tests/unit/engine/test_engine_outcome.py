"""How a run ended, pure logic: a stop signal noted before Tune's own handler, interrupted vs ended by Tune, the
verdict of a failed experiment (fail_fast's trial error first), and the spec's num_samples=-1."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.engine import compat
from airflow_tune.engine.outcome import StopSignals, failure_reason, interrupted, stop_reason


def _spec(**fields: Any) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "/tmp/aft-x", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, **fields})


@pytest.fixture
def tune_handlers() -> Iterator[list[int]]:
    """Handlers of SIGINT and SIGUSR1 standing in for the ones Tune's fit() installs; restored afterwards."""
    seen: list[int] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGUSR1)}
    for s in saved:
        signal.signal(s, lambda sig, frame: seen.append(sig))
    yield seen
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGUSR1])
def test_a_stop_signal_is_noted_and_still_reaches_tunes_handler(tune_handlers, stop):
    signals = StopSignals()
    signals.setup()
    assert signals.watched and signals.signal is None
    os.kill(os.getpid(), stop)
    assert tune_handlers == [stop]  # Tune still ends its loop and saves the state
    assert signals.signal == stop and signals.signal_name == stop.name
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.signal == stop  # the first one is kept


def test_without_tunes_handler_the_signals_are_not_watched():
    saved = signal.getsignal(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        assert compat.watch_stop_signals(lambda sig: None) is False
    finally:
        signal.signal(signal.SIGUSR1, saved)


@pytest.mark.parametrize(
    ("signum", "watched", "unfinished", "expected"),
    [
        (signal.SIGINT, True, ["t1"], True),  # a stopped job
        (signal.SIGUSR1, True, [], True),  # a stop at the very end still resumes (nothing is lost)
        (None, True, ["t1", "t2"], False),  # Tune stopped them itself: a budget, fail_fast
        (None, True, [], False),  # every trial ended
        (None, False, ["t1"], True),  # signals not watched: the old, safe reading
        (None, False, [], False),
    ],
)
def test_interrupted_only_by_a_stop_signal_when_signals_are_watched(signum, watched, unfinished, expected):
    signals = StopSignals()
    signals.signal, signals.watched = signum, watched
    assert interrupted(signals, unfinished) is expected


def _row(trial_id: str, error: str | None = None, loss: float | None = 1.0) -> dict[str, Any]:
    return {
        "trial_id": trial_id,
        "error": error,
        "error_summary": error.splitlines()[-1] if error else None,
        "path": f"s3://b/e/{trial_id}",
        "metrics": {"loss": loss} if loss is not None else {},
    }


def _manifest(rows: list[dict[str, Any]], best: str | None = "t1") -> dict[str, Any]:
    errored = sum(1 for r in rows if r["error"])
    return {"trials": rows, "num_errored": errored, "num_terminated": len(rows) - errored, "best_trial_id": best}


def test_fail_fast_fails_with_the_trials_own_exception_first():
    spec = _spec(failure={"fail_fast": True})
    rows = [_row("t1"), _row("t2", "Traceback ...\nValueError: boom at step 1"), _row("t3", "KeyError: 'later'")]
    reason = failure_reason(spec, _manifest(rows))
    assert reason is not None and reason.startswith("ValueError: boom at step 1 (trial t2 of experiment e;"), reason
    assert "failure.fail_fast=true" in reason and reason.endswith("full text: s3://b/e/t2/error.txt)")
    assert stop_reason(spec, _manifest(rows)) == "failure.fail_fast after a trial's error"


def test_a_spent_budget_with_stopped_trials_succeeds():
    spec = _spec(time_budget_s=5)
    manifest = _manifest([_row("t1"), _row("t2", loss=None)])
    assert failure_reason(spec, manifest) is None
    assert stop_reason(spec, manifest) == "time_budget_s=5 spent"


@pytest.mark.parametrize(
    ("fields", "rows", "best", "expected"),
    [
        ({}, [_row("t1", "ValueError: x")], None, "experiment e failed: all 1 trials errored"),
        (
            {"failure": {"tolerate_errored_trials": False}},
            [_row("t1"), _row("t2", "ValueError: x")],
            "t1",
            "experiment e failed: 1 trials errored and failure.tolerate_errored_trials=false",
        ),
        ({}, [_row("t1", loss=None)], None, "experiment e failed: no trial reported the metric 'loss'"),
        ({}, [_row("t1"), _row("t2", "ValueError: x")], "t1", None),  # errored trials tolerated by default
    ],
)
def test_other_failures_keep_their_verdicts(fields, rows, best, expected):
    reason = failure_reason(_spec(**fields), _manifest(rows, best))
    assert reason == expected if expected is None else reason.startswith(expected), reason


def test_a_stop_of_the_whole_experiment_is_named():
    spec = _spec(num_samples=-1, stop=[{"name": "timeout", "args": {"timeout": 60}}])
    assert stop_reason(spec, _manifest([_row("t1")])) == "the timeout stopper"
    spec = _spec(time_budget_s=9, stop=[{"name": "experiment_plateau"}])
    assert stop_reason(spec, _manifest([_row("t1")])) == "time_budget_s=9 spent or the experiment_plateau stopper"


def test_num_samples_minus_one_needs_something_that_ends_the_experiment():
    assert _spec(num_samples=-1, time_budget_s=60).num_samples == -1
    assert _spec(num_samples=-1, stop=[{"name": "timeout", "args": {"timeout": 60}}]).num_samples == -1
    assert _spec(num_samples=-1, stop=[{"name": "experiment_plateau"}]).num_samples == -1
    # Per-trial criteria stop trials, not the sampling.
    for stop in (None, {"training_iteration": 5}, [{"name": "trial_plateau"}, {"metric": "loss", "below": 0.1}]):
        with pytest.raises(SpecError) as info:
            _spec(num_samples=-1, stop=stop)
        text = str(info.value)
        assert "num_samples = -1" in text and "nothing ends the experiment" in text and "set time_budget_s" in text
    for bad in (0, -2):
        with pytest.raises(SpecError) as info:
            _spec(num_samples=bad, time_budget_s=60)
        assert f"num_samples = {bad}" in str(info.value) and "-1 with a time_budget_s" in str(info.value)
