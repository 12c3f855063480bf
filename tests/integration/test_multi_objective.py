"""Several objectives as one Ray job: ``metric=["loss", "acc"], mode=["min", "max"]`` with Optuna's searcher (the
lists on the searcher, TuneConfig without a metric, as Tune's docs write it), seeded with two points of which the
second is dominated by the first. The result's best trial goes by the first objective; its Pareto front is every
finished trial no other beats in both objectives, from each trial's last result (checked here by brute force); and
Optuna's own study, saved with the experiment, has two directions and holds both values of every trial."""

from __future__ import annotations

import json
import pickle

import pytest

from airflow_tune.common import storage
from airflow_tune.common.contract import xcom_result
from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs

pytestmark = pytest.mark.timeout(180)

SEEDS = [{"x": 1.0, "y": 0.0}, {"x": 1.0, "y": 0.5}]


def _front(trials: list[dict]) -> set[str]:
    """Brute force: the trials whose (loss, -acc) no other trial's is <= in both and < in one."""
    scores = {t["trial_id"]: (t["metrics"]["loss"], -t["metrics"]["acc"]) for t in trials}
    return {
        tid
        for tid, a in scores.items()
        if not any(b[0] <= a[0] and b[1] <= a[1] and b != a for other, b in scores.items() if other != tid)
    }


def test_optuna_searches_two_objectives_and_the_result_gives_the_pareto_front(stack):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("two-objectives"),
        "tune_testkit.objectives:two_objectives",
        metric=["loss", "acc"],
        mode=["min", "max"],
        param_space={"x": {"uniform": [0, 2]}, "y": {"uniform": [0, 1]}},
        search={"name": "optuna", "args": {"seed": 7}},
        points_to_evaluate=SEEDS,
        num_samples=6,
        max_concurrent_trials=2,
    )
    text, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 6, manifest
    objectives = [{"metric": "loss", "mode": "min"}, {"metric": "acc", "mode": "max"}]
    assert manifest["objectives"] == objectives and (manifest["metric"], manifest["mode"]) == ("loss", "min")
    # The best trial: by the first objective, the last result of each trial.
    assert_best(manifest, "loss", "min")
    trials = {t["trial_id"]: t for t in storage.read_json(manifest["trials_uri"])["trials"]}
    assert all(t["metrics"]["training_iteration"] == 2 for t in trials.values())
    expected = _front(list(trials.values()))
    listed = [t["trial_id"] for t in manifest["pareto_front"]]
    assert set(listed) == expected and manifest["pareto_front_size"] == len(expected)
    assert {tid for tid, t in trials.items() if t["pareto"]} == expected
    losses = [t["metrics"]["loss"] for t in manifest["pareto_front"]]
    assert losses == sorted(losses)  # best first by the first objective
    for row in manifest["pareto_front"]:
        trial = trials[row["trial_id"]]
        assert row["config"] == trial["config"]
        assert row["metrics"] == {"loss": trial["metrics"]["loss"], "acc": trial["metrics"]["acc"]}
    by_config = {(t["config"]["x"], t["config"]["y"]): tid for tid, t in trials.items()}
    # The first seed beats the second in loss at equal acc: on the front, the second not.
    assert by_config[(1.0, 0.0)] in expected and by_config[(1.0, 0.5)] not in expected
    assert manifest["best_trial_id"] in expected  # the best by the first objective is never dominated
    # The XCom: the objectives, the front, small.
    xcom = xcom_result(manifest, "job", None)
    assert xcom["objectives"] == objectives and xcom["pareto_front"] == manifest["pareto_front"]
    assert xcom["pareto_front_size"] == len(expected) and len(json.dumps(xcom)) < 64 * 1024
    # Optuna searched both objectives: its study, saved with the experiment's searcher state.
    (state_uri,) = [u for u in storage.list_files(manifest["experiment_uri"]) if "/searcher-state-" in u]
    state = pickle.loads(storage.read_bytes(state_uri))  # written by this test's own experiment
    study = state["_ot_study"]
    assert state["_metric"] == ["loss", "acc"] and len(study.directions) == 2
    told = sorted(tuple(t.values) for t in study.trials if t.values is not None)
    assert told == sorted((t["metrics"]["loss"], t["metrics"]["acc"]) for t in trials.values())
