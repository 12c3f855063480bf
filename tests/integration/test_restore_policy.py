"""A retry's changed policy on a restored experiment, as real Ray jobs: a job stopped with its state saved, then run
again with a changed spec. Tune restores the first run's policy from ``tuner.pkl`` and the experiment state; the
engine applies the spec's (engine/build.py ``apply_policy``), and refuses what a restored experiment cannot take."""

from __future__ import annotations

import os
import time

import pytest

from tests.integration.test_engine_restore import _checkpointing_spec, _hold, _progress_at_interrupt
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(240)


def _stop_while_held(stack, tmp_path, spec: dict, x: int, step: int) -> None:
    """Run ``spec`` until trial ``x`` is held after its ``step``, stop the job (Tune saves its state), let go."""
    hold = _hold(tmp_path, x=x, step=step)
    spec["param_space"]["hold"] = hold
    job_id = jobs.submit(stack, spec)
    jobs.stop_when(stack, job_id, lambda: _progress_at_interrupt(str(tmp_path))[1].get(x) == step, f"x={x} at {step}")
    os.remove(hold["file"])


def test_changed_failure_and_checkpoint_policy_apply_and_a_changed_seed_is_refused(stack, tmp_path):
    """The first run allows no retry (max_failures 0) and keeps every checkpoint. A retry changing the seeded point
    is refused before Tune starts (Tune restores the searcher with the points it was seeded with), naming the
    field, both values and the fix. The retry raising max_failures to 1 and keeping 2 checkpoints: the resumed
    trial's crash at its step 5 is retried from its checkpoint and the trial finishes (with the pickled 0 it
    errored), and only the newest 2 of its 8 checkpoints remain (the first run's included; with the pickled policy
    all of them)."""
    spec = _checkpointing_spec(stack, tmp_path, "policy", xs=[1], steps=8, sleep=0.05)
    spec["param_space"].update(x={"choice": [1, 2]}, crash_at_step=5)
    spec.update(points_to_evaluate=[{"x": 1}], errored_trials="keep")
    _stop_while_held(stack, tmp_path, spec, x=1, step=1)
    runs = len(read_markers(str(tmp_path)))

    job_id = jobs.submit(stack, {**spec, "points_to_evaluate": [{"x": 2}]})
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    assert jobs.exit_code(stack, job_id) == 2
    text = jobs.logs(stack, job_id)
    assert 'points_to_evaluate: [{"x": 1}] -> [{"x": 2}]' in text, text[-3000:]
    assert "give this run another experiment_name" in text and "restored experiment" not in text
    assert len(read_markers(str(tmp_path))) == runs

    spec.update(failure={"max_failures": 1}, checkpoint={"num_to_keep": 2})
    logs, manifest = jobs.run_ok(stack, spec)
    assert "[airflow-tune] restored experiment" in logs
    assert manifest["num_errored"] == 0 and manifest["num_terminated"] == 1, logs[-4000:]
    events = [m["event"] for m in read_markers(str(tmp_path))]
    assert events.index("crash") < events.index("resume5") < events.index("end"), events
    (trial,) = manifest["trials"]
    kept = [jobs.read_checkpoint_state(uri)["step"] for uri in jobs.checkpoint_dirs(trial["path"])]
    assert kept == [6, 7], kept


def test_changed_time_budget_ends_the_restored_run(stack, tmp_path):
    """The first run has 600 s; the retry 12 s in all: the restored run ends by the budget (the time the first run
    spent counted), long before the trial's 150 steps of 0.2 s would."""
    spec = _checkpointing_spec(stack, tmp_path, "policy-budget", xs=[1], steps=150, sleep=0.2, time_budget_s=600)
    _stop_while_held(stack, tmp_path, spec, x=1, step=1)

    spec["time_budget_s"] = 12
    started = time.monotonic()
    logs, manifest = jobs.run_ok(stack, spec)
    took = time.monotonic() - started
    assert "[airflow-tune] restored experiment" in logs
    assert "Tune ended the experiment (time_budget_s=12 spent" in logs, logs[-4000:]
    (trial,) = manifest["trials"]
    assert trial["metrics"]["step"] < 100, trial["metrics"]
    assert took < 25, took
