"""Checkpoints and stopping, as a real Ray job: Function API checkpoints and resume, Class API checkpoint policy,
actor reuse, ``stop`` and ``done``. The best checkpoint in the manifest is downloaded from S3 and read back."""

from __future__ import annotations

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


def test_function_checkpoints_best_not_latest_and_resume_after_a_crash(stack, tmp_path):
    """tune.report(..., checkpoint=) every step; a trial that crashes once resumes from tune.get_checkpoint()."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("fn-ckpt"),
        "tune_testkit.functions:checkpointing",
        param_space={
            "x": {"grid_search": [1, 3]},
            "steps": 5,
            "best_step": 2,
            "crash_at_step": 3,
            "marker_dir": str(tmp_path),
        },
        failure={"max_failures": 1},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    for trial in manifest["trials"]:
        assert trial["metrics"]["training_iteration"] == 5
        assert len(jobs.checkpoint_dirs(trial["path"])) == 5, "one checkpoint per reported step, all kept"
    # Each trial crashed once at step 3 and resumed from its checkpoint of step 2, not from scratch.
    markers = read_markers(str(tmp_path))
    for x in (1, 3):
        events = [m["event"] for m in markers if m["x"] == x]
        assert events.count("start") == 1 and events.count("crash") == 1 and events.count("resume3") == 1, events
        assert [m["step"] for m in markers if m["x"] == x and m["event"] == "step"] == [0, 1, 2, 3, 4]
    # The best checkpoint is the best trial's best step (2), not its latest (4).
    uri = manifest["best_checkpoint_uri"]
    assert uri.startswith(f"{manifest['experiment_uri']}/") and uri.startswith("s3://")
    state = jobs.read_checkpoint_state(uri)
    assert state["x"] == 3 and state["step"] == 2
    assert state["loss"] == pytest.approx(0.01)


def test_class_api_checkpoint_frequency_at_end_and_num_to_keep(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("cls-ckpt"),
        "tune_testkit.classes:Stepper",
        param_space={"x": {"grid_search": [2, 3]}, "best_iter": 4, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 8},
        checkpoint={"frequency": 2, "at_end": True, "num_to_keep": 2},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    markers = read_markers(str(tmp_path))
    for trial in manifest["trials"]:
        assert trial["metrics"]["training_iteration"] == 8
        saved = sorted(m["it"] for m in markers if m["event"] == "save" and m["trial_id"] == trial["trial_id"])
        assert saved == [2, 4, 6, 8], "every 2nd iteration; at_end adds none at 8 (already saved there)"
        kept = [jobs.read_checkpoint_state(uri)["it"] for uri in jobs.checkpoint_dirs(trial["path"])]
        # num_to_keep=2 without a score_attribute keeps the two newest, as Tune does: 2 and 4 are deleted.
        assert sorted(kept) == [6, 8], kept
    cleanups = [m for m in markers if m["event"] == "cleanup"]
    assert len(cleanups) == 2
    state = jobs.read_checkpoint_state(manifest["best_checkpoint_uri"])
    assert state["trial_id"] == manifest["best_trial_id"] and state["x"] == 3
    # The best of the kept checkpoints (6: loss 0.26), not the latest (8: loss 0.48).
    assert state["it"] == 6 and state["loss"] == pytest.approx(0.26), "the best kept checkpoint, not the latest"


def test_class_api_checkpoint_at_end_only(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("cls-end"),
        "tune_testkit.classes:Stepper",
        param_space={"x": {"grid_search": [3, 4]}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 3},
        checkpoint={"at_end": True},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["best_config"]["x"] == 3
    for trial in manifest["trials"]:
        assert [jobs.read_checkpoint_state(u)["it"] for u in jobs.checkpoint_dirs(trial["path"])] == [3]
    state = jobs.read_checkpoint_state(manifest["best_checkpoint_uri"])
    assert state["trial_id"] == manifest["best_trial_id"] and state["it"] == 3


def test_reuse_actors_runs_trials_on_fewer_processes(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("reuse"),
        "tune_testkit.classes:Reusable",
        param_space={"x": {"grid_search": [0, 1, 3, 5]}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 2},
        reuse_actors=True,
        max_concurrent_trials=2,
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert manifest["num_trials"] == 4
    markers = read_markers(str(tmp_path))
    assert {m["x"] for m in markers if m["event"] in ("setup", "reset")} == {0, 1, 3, 5}
    assert [m for m in markers if m["event"] == "reset"], "reset_config was never called"
    # The processes that ran the trials' steps: fewer than the trials.
    ran_on = {m["x"]: m["pid"] for m in markers if m["event"] == "step"}
    assert sorted(ran_on) == [0, 1, 3, 5]
    assert len(set(ran_on.values())) < 4, f"4 trials on {len(set(ran_on.values()))} processes: no actor was reused"


def test_stop_on_training_iteration(stack, tmp_path):
    """``stop`` on Tune's auto-filled training_iteration ends a trainable that would run forever."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("stop-it"),
        "tune_testkit.functions:forever",
        param_space={"x": {"grid_search": [1, 3]}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 3},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert manifest["best_metrics"]["loss"] == pytest.approx(1 / 3)
    assert [t["metrics"]["training_iteration"] for t in manifest["trials"]] == [3, 3]


def test_step_returning_done_ends_the_trial(stack):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("done"),
        "tune_testkit.classes:SaysDone",
        param_space={"x": {"grid_search": [2, 3]}, "iters": {"grid_search": [2, 5]}},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 4
    for trial in manifest["trials"]:
        assert trial["metrics"]["training_iteration"] == trial["config"]["iters"]
        assert trial["metrics"]["done"] is True
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"] == {"x": 3, "iters": 5}
    assert manifest["best_metrics"]["loss"] == pytest.approx(0.2)
