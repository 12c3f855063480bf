"""Searchers and schedulers reached only through factories, each once as a real Ray job, written as Tune's own
examples write them: Nevergrad, ZOOpt, and TuneBOHB with HyperBandForBOHB on a nested space, each seeded with a point
that lacks a nested key (the engine samples it, and hands the point over in the searcher's "a/b" form: each of them
failed on the spec's nested form), some carrying their own metric and mode (Tune raises at fit() when TuneConfig gives
them too); a ResourceChangingScheduler giving a trial the cluster's free CPU. Ax and HEBO, which need PyTorch, run on a
Ray head of their own virtualenv: test_torch_searchers.py. Few trials, tiny trainables."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_tune.common.contract import RESULT_KEYS, xcom_result
from tests.integration.test_engine_forms import assert_best
from tests.integration.test_searchers import _filled
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)

ACTS = ("relu", "tanh")
SPACE: dict[str, Any] = {
    "x": {"uniform": [0, 10]},
    "net": {"width": {"randint": [1, 9]}, "act": {"choice": list(ACTS)}},
    "steps": 1,
}
#: The warm start: x and net.width given, net.act left for the engine to sample.
SEED = {"x": 3.0, "net": {"width": 4}}


def _run(stack, tmp_path, prefix: str, **fields: Any) -> tuple[str, dict, dict]:
    space = {**SPACE, **fields.pop("space", {}), "marker_dir": str(tmp_path)}
    spec = jobs.base_spec(
        stack, jobs.unique_name(prefix), "tune_testkit.functions:quadratic", param_space=space, **fields
    )
    text, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    xcom = xcom_result(manifest, "job", None)
    assert set(RESULT_KEYS) <= set(xcom) and xcom["metric"] == "loss" and xcom["mode"] == "min"
    assert xcom["best_config"] == manifest["best_config"] and len(json.dumps(xcom)) < 64 * 1024
    return text, manifest, xcom


def _assert_seeded_and_suggested(text: str, manifest: dict, samples: int) -> dict:
    """The seed ran with its sampled fill, and every other trial is a suggestion from the nested space."""
    assert manifest["num_trials"] == samples, manifest
    configs = [t["config"] for t in manifest["trials"]]
    (seed,) = [c for c in configs if c["x"] == 3.0]
    assert seed["net"] == {"width": 4, "act": _filled(text, 0, "net.act")}
    for config in configs:
        assert 0 <= config["x"] <= 10 and config["net"]["act"] in ACTS
        assert isinstance(config["net"]["width"], int) and 1 <= config["net"]["width"] <= 8
    assert len({c["x"] for c in configs}) == samples, configs  # suggested, not the seed again
    return seed


def test_nevergrad_factory_takes_a_nested_seed_first(stack, tmp_path):
    """NevergradSearch with no metric of its own: the Tuner gives it the spec's."""
    text, manifest, _ = _run(
        stack,
        tmp_path,
        "nevergrad",
        num_samples=3,
        max_concurrent_trials=1,
        search={"factory": "tune_testkit.factories:nevergrad"},
        points_to_evaluate=[SEED],
    )
    _assert_seeded_and_suggested(text, manifest, 3)
    assert [m["x"] for m in read_markers(str(tmp_path), "start")][0] == 3.0


def test_zoopt_factory_with_its_own_metric_takes_a_nested_seed_first(stack, tmp_path):
    text, manifest, _ = _run(
        stack,
        tmp_path,
        "zoopt",
        num_samples=3,
        max_concurrent_trials=1,
        search={"factory": "tune_testkit.factories:zoopt", "args": {"budget": 3}},
        points_to_evaluate=[SEED],
    )
    _assert_seeded_and_suggested(text, manifest, 3)
    assert [m["x"] for m in read_markers(str(tmp_path), "start")][0] == 3.0


def test_bohb_with_hyperband_for_bohb_both_carrying_their_metric(stack, tmp_path):
    """Tune's BOHB example: both objects built with metric and mode. BOHB registers each result at a HyperBand
    budget, where the nested seed used to fail; one trial at a time (TuneBOHB's own limit, which leaves paused trials
    out), so the first start is its first suggestion: the seed."""
    text, manifest, xcom = _run(
        stack,
        tmp_path,
        "bohb",
        space={"steps": 2},
        num_samples=3,
        search={"factory": "tune_testkit.factories:bohb", "args": {"max_concurrent": 1}},
        scheduler={"factory": "tune_testkit.factories:hyperband_for_bohb", "args": {"max_t": 2, "reduction_factor": 2}},
        points_to_evaluate=[SEED],
    )
    _assert_seeded_and_suggested(text, manifest, 3)
    assert [m["x"] for m in read_markers(str(tmp_path), "start")][0] == 3.0
    assert all(1 <= t["metrics"]["training_iteration"] <= 2 for t in manifest["trials"])
    assert xcom["best_metrics"]["loss"] == min(t["metrics"]["loss"] for t in manifest["trials"])


def test_resource_changing_scheduler_gives_a_trial_the_free_cpu(stack, tmp_path):
    """ResourceChangingScheduler over an ASHA carrying its own metric, with Tune's default allocation: the one trial
    starts on 1 CPU, is paused after its first result and resumed from its checkpoint on both of the head's CPUs."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("resource-changing"),
        "tune_testkit.factories:resumable",
        param_space={"x": {"uniform": [0, 10]}, "net": {"width": {"randint": [1, 9]}}, "marker_dir": str(tmp_path)},
        num_samples=1,
        scheduler={"factory": "tune_testkit.factories:resource_changing", "args": {"max_t": 4}},
        points_to_evaluate=[{"x": 2.0, "net": {"width": 3}}],
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    runs = read_markers(str(tmp_path), "run")
    assert runs[0]["start"] == 0 and runs[0]["cpus"] == 1, runs
    assert any(r["start"] > 0 and r["cpus"] == 2 for r in runs[1:]), runs
    assert manifest["best_config"] == {"x": 2.0, "net": {"width": 3}, "marker_dir": str(tmp_path)}
    assert manifest["best_metrics"]["training_iteration"] == 4 and manifest["best_metrics"]["cpus"] == 2
