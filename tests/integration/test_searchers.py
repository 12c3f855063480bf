"""The model-based searchers with seed points that lack keys, and every scheduler and searcher the README names
that test_engine_search.py does not run, each once as a real Ray job: Optuna and HyperOpt seeded with a point
missing a top-level and a nested key (the engine samples them, logs them, and the seed runs first), BayesOpt with a
seed missing a nested key (its optimizer registers the completed point), MedianStoppingRule and HyperBand stopping
a trial early, PB2 exploiting another trial's checkpoint. Few trials, few iterations, tiny trainables."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)

#: A space with a nested config; a seed below gives x and net.width only.
SPACE: dict[str, Any] = {
    "x": {"uniform": [0, 10]},
    "y": {"uniform": [0, 1]},
    "net": {"width": {"randint": [1, 9]}, "act": {"choice": ["relu", "tanh"]}},
}
SEED = {"x": 3.0, "net": {"width": 4}}


def _filled(text: str, index: int, key: str) -> Any:
    """The value the engine logged it sampled for ``key`` of point ``index``."""
    found = re.search(rf"points_to_evaluate\[{index}\] has no {re.escape(key)}: sampled (.+?) from its domain", text)
    assert found, f"no fill of {key} logged; logs:\n{text[-4000:]}"
    return ast.literal_eval(found.group(1))


def _by_x(manifest: dict, x: float) -> dict:
    (trial,) = [t for t in manifest["trials"] if t["config"]["x"] == x]
    return trial


def _seeded_run(stack, tmp_path, searcher: str, **fields: Any) -> tuple[str, dict]:
    spec = jobs.base_spec(
        stack,
        jobs.unique_name(f"seeds-{searcher}"),
        "tune_testkit.functions:quadratic",
        param_space={**SPACE, "marker_dir": str(tmp_path), **fields.pop("extra_space", {})},
        max_concurrent_trials=1,
        search={"name": searcher},
        **fields,
    )
    text, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    # One trial at a time, and a model-based searcher suggests one per free slot: start order is its order.
    started = [m["x"] for m in read_markers(str(tmp_path), "start")]
    assert started[0] == 3.0, started
    seeded = _by_x(manifest, 3.0)["config"]
    assert seeded["net"]["width"] == 4
    assert seeded["y"] == _filled(text, 0, "y") and 0 <= seeded["y"] <= 1
    assert seeded["net"]["act"] == _filled(text, 0, "net.act") and seeded["net"]["act"] in ("relu", "tanh")
    return text, manifest


def test_optuna_fills_a_seed_and_the_median_stopping_rule_stops_a_bad_trial(stack, tmp_path):
    """Two experiments' worth of evidence in one job: the second point is complete and bad, so MSR (grace 1, one
    sample needed) compares it with the finished first trial and stops it at its first result."""
    text, manifest = _seeded_run(
        stack,
        tmp_path,
        "optuna",
        extra_space={"steps": 4},
        num_samples=2,
        points_to_evaluate=[SEED, {"x": 9.0, "y": 0.5, "net": {"width": 2, "act": "tanh"}}],
        scheduler={
            "name": "median_stopping_rule",
            "args": {"time_attr": "training_iteration", "grace_period": 1, "min_samples_required": 1},
        },
    )
    assert "points_to_evaluate[1] has no" not in text
    assert _by_x(manifest, 9.0)["config"]["net"] == {"width": 2, "act": "tanh"}
    iters = {t["config"]["x"]: t["metrics"]["training_iteration"] for t in manifest["trials"]}
    assert iters == {3.0: 4, 9.0: 1}, iters


def test_hyperopt_fills_a_seed_top_level_and_nested(stack, tmp_path):
    _, manifest = _seeded_run(
        stack, tmp_path, "hyperopt", extra_space={"steps": 1}, num_samples=2, points_to_evaluate=[SEED]
    )
    assert manifest["num_trials"] == 2


def test_bayesopt_registers_a_seed_completed_by_sampling(stack, tmp_path):
    """BayesOpt feeds each finished trial's parameters to its optimizer, which refuses a point lacking a key: with
    one random step, the seed's result is registered before the next suggestions, which then come from the model."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("bayesopt"),
        "tune_testkit.functions:quadratic",
        param_space={
            "x": {"uniform": [0, 10]},
            "n": {"y": {"uniform": [0, 1]}},
            "steps": 1,
            "marker_dir": str(tmp_path),
        },
        num_samples=3,
        max_concurrent_trials=1,
        search={"name": "bayesopt", "args": {"random_search_steps": 1}},
        points_to_evaluate=[{"x": 3.0}],
    )
    text, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["num_trials"] == 3
    assert [m["x"] for m in read_markers(str(tmp_path), "start")][0] == 3.0
    assert _by_x(manifest, 3.0)["config"]["n"]["y"] == _filled(text, 0, "n.y")
    assert all(0 <= t["config"]["x"] <= 10 and 0 <= t["config"]["n"]["y"] <= 1 for t in manifest["trials"])


def test_hyperband_stops_the_worse_trial_of_a_bracket_early(stack, tmp_path):
    """max_t=2, reduction_factor=2: Tune's first bracket runs 2 trials to max_t, the second halves its 2 trials at
    iteration 1. All 4 grid trials are added before any result, so exactly one trial ends at iteration 1."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("hyperband"),
        "tune_testkit.classes:Stepper",
        param_space={"x": {"grid_search": [3, 2.5, 0, -2]}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 2},
        scheduler={"name": "hyperband", "args": {"time_attr": "training_iteration", "max_t": 2, "reduction_factor": 2}},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    iters = sorted(t["metrics"]["training_iteration"] for t in manifest["trials"])
    assert iters == [1, 2, 2, 2], iters


def test_pb2_exploits_another_trials_checkpoint(stack, tmp_path):
    lrs = [0.5, 1, 2, 4]
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("pb2"),
        "tune_testkit.classes:PbtModel",
        param_space={"lr": {"grid_search": lrs}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 3},
        scheduler={
            "name": "pb2",
            "args": {
                "time_attr": "training_iteration",
                "perturbation_interval": 2,
                "hyperparam_bounds": {"lr": [0.5, 4]},
                "quantile_fraction": 0.25,
                "synch": True,
            },
        },
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 4 and manifest["num_terminated"] == 4
    assert_best(manifest, "loss", "min")
    # Synchronous PB2: at iteration 2 the worst trial (of 4, quantile 0.25) takes the best one's checkpoint.
    loads = read_markers(str(tmp_path), "load")
    assert any(m["source_trial"] != m["trial_id"] for m in loads), loads
    # Its new lr comes from PB2's model, inside the bounds.
    assert all(0.5 <= t["config"]["lr"] <= 4 for t in manifest["trials"])
