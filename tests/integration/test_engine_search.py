"""Schedulers and searchers as a real Ray job: ASHA stops bad trials early, PBT exploits through checkpoints, a
searcher evaluates the given points first, and a searcher whose package is missing fails fast naming it."""

from __future__ import annotations

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


def test_asha_stops_bad_trials_early(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("asha"),
        "tune_testkit.functions:quadratic",
        # Grid order is start order: the good trials reach the first rung before the bad ones.
        param_space={"x": {"grid_search": [3, 2.5, 0, -2]}, "steps": 6, "sleep": 0.05, "marker_dir": str(tmp_path)},
        max_concurrent_trials=2,
        scheduler={"name": "asha", "args": {"max_t": 6, "grace_period": 1, "reduction_factor": 2}},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    iters = {t["config"]["x"]: t["metrics"]["training_iteration"] for t in manifest["trials"]}
    assert iters[3] == 6
    assert iters[0] < 6 and iters[-2] < 6, f"ASHA stopped no bad trial early: {iters}"
    assert len(read_markers(str(tmp_path), "end")) < 4


def test_pbt_exploits_and_mutates_through_checkpoints(stack, tmp_path):
    lrs = [0.5, 1, 2, 4]
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("pbt"),
        "tune_testkit.classes:PbtModel",
        param_space={"lr": {"grid_search": lrs}, "sleep": 0.1, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 6},
        scheduler={
            "name": "pbt",
            "args": {
                "time_attr": "training_iteration",  # PBT's default is time_total_s (seconds)
                "perturbation_interval": 2,
                "hyperparam_mutations": {"lr": lrs},
                "quantile_fraction": 0.25,
                "synch": True,
            },
        },
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 4 and manifest["num_terminated"] == 4
    assert_best(manifest, "loss", "min")
    # Exploitation: a trial loaded another trial's checkpoint.
    loads = read_markers(str(tmp_path), "load")
    assert any(m["source_trial"] != m["trial_id"] for m in loads), loads
    # The best checkpoint is the best trial's and holds the weight that gives its best loss.
    state = jobs.read_checkpoint_state(manifest["best_checkpoint_uri"])
    assert state["trial_id"] == manifest["best_trial_id"]
    assert 100 - state["w"] == pytest.approx(manifest["best_metrics"]["loss"])
    assert manifest["best_config"]["lr"] in lrs and manifest["best_config"]["lr"] == state["lr"]


@pytest.mark.parametrize("searcher", ["optuna", "random"])
def test_searcher_evaluates_points_to_evaluate_first(stack, tmp_path, searcher):
    points = [{"x": 3.0}, {"x": 7.5}]
    spec = jobs.base_spec(
        stack,
        jobs.unique_name(f"points-{searcher}"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"uniform": [0, 10]}, "steps": 1, "marker_dir": str(tmp_path)},
        num_samples=4,
        max_concurrent_trials=1,
        search={"name": searcher},
        points_to_evaluate=points,
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 4
    started = [m["x"] for m in read_markers(str(tmp_path), "start")]
    if searcher == "random":
        # The basic generator creates all trials at once (ids <uuid>_<n> in suggestion order), and Tune may start
        # them in another order even with max_concurrent_trials=1.
        suggested = [t["config"]["x"] for t in sorted(manifest["trials"], key=lambda t: t["trial_id"])]
    else:
        # Optuna's trial ids are random; it suggests one trial per free slot, so the start order is its order.
        suggested = started
    assert suggested[:2] == [3.0, 7.5], suggested
    assert sorted(started) == sorted(t["config"]["x"] for t in manifest["trials"]) and len(set(started)) == 4
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3.0
    assert manifest["best_metrics"]["loss"] == pytest.approx(1.0)


def test_searcher_with_missing_package_fails_fast_naming_it(stack, tmp_path):
    """A factory importing a package the cluster lacks (a named searcher's missing package: a unit test, as every
    named searcher's package is installed here)."""
    package = "airflow_tune_missing_searcher_pkg"
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("missing-pkg"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"uniform": [0, 10]}, "marker_dir": str(tmp_path)},
        search={"factory": "tune_testkit.searchers:needs_missing_package"},
    )
    job_id = jobs.submit(stack, spec)
    assert jobs.wait(stack, job_id, 60) == "FAILED"
    assert jobs.exit_code(stack, job_id) == 2
    text = jobs.logs(stack, job_id)
    assert f"needs the package '{package}'" in text, text[-3000:]
    assert read_markers(str(tmp_path)) == [], "no trial may run"
