"""What a restored experiment cannot take from a retry's changed spec is refused before submission, naming the
field, both values and the fix; the rest of a changed policy (failures, checkpoints, budget, concurrency, actor
reuse) is not refused: the engine applies it to the restored experiment."""

from __future__ import annotations

import pytest

from airflow_tune.common.spec import ExperimentSpec, restore_conflicts
from airflow_tune.exceptions import ExperimentConflictError
from airflow_tune.utils import reconcile

pytestmark = pytest.mark.unit


def _spec(tmp_path, **fields) -> ExperimentSpec:
    return ExperimentSpec.from_dict(
        {
            "trainable": "pkg.mod:train",
            "name": "exp",
            "storage_path": str(tmp_path),
            "metric": "loss",
            "mode": "min",
            "param_space": {"x": {"choice": [1, 2]}},
            **fields,
        }
    )


def test_policy_changes_are_not_conflicts(tmp_path):
    before = _spec(tmp_path, max_concurrent_trials=2).to_dict()
    after = _spec(
        tmp_path,
        failure={"max_failures": 3},
        checkpoint={"num_to_keep": 2, "score_attribute": "loss", "score_order": "min"},
        time_budget_s=60,
        max_concurrent_trials=1,
        reuse_actors=True,
    ).to_dict()
    assert restore_conflicts(before, after) == []


def test_seeds_resources_and_a_new_limiter_are_conflicts(tmp_path):
    before = _spec(tmp_path, search={"name": "optuna"}, points_to_evaluate=[{"x": 1}]).to_dict()
    after = _spec(
        tmp_path,
        search={"name": "optuna"},
        points_to_evaluate=[{"x": 2}],
        resources={"cpu": 2},
        max_concurrent_trials=1,
    ).to_dict()
    found = restore_conflicts(before, after)
    assert found[0].startswith('points_to_evaluate: [{"x": 1}] -> [{"x": 2}] (Tune restores the searcher')
    assert found[1].startswith("resources: null -> ")
    assert found[2].startswith("max_concurrent_trials: null -> 1 (the restored optuna searcher")
    # random and grid take a new limit
    assert restore_conflicts(_spec(tmp_path).to_dict(), _spec(tmp_path, max_concurrent_trials=1).to_dict()) == []


def test_the_operator_refuses_a_conflict_only_when_the_experiment_will_be_restored(tmp_path):
    recorded = _spec(tmp_path, points_to_evaluate=[{"x": 1}]).to_dict()
    spec = _spec(tmp_path, points_to_evaluate=[{"x": 2}])
    reconcile.refuse_restore_conflicts(spec, recorded)  # no Tune state: a fresh start takes any point
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "tuner.pkl").write_bytes(b"")
    with pytest.raises(ExperimentConflictError) as err:
        reconcile.refuse_restore_conflicts(spec, recorded)
    text = str(err.value)
    assert 'points_to_evaluate: [{"x": 1}] -> [{"x": 2}]' in text and "experiment_name" in text, text
