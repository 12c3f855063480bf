"""Forms plain Tune runs, which the spec refused before issue 33, run as Tune runs them (real Ray jobs):

- PB2 with nested ``hyperparam_bounds`` (``{"opt": {"lr": [0.5, 4]}}``) mutates the nested parameter: a trial takes
  another's checkpoint and goes on with a new ``opt.lr`` inside the bounds; in the same experiment, an empty head
  bundle (``[{}, {"CPU": 1}]``): the trainable holds no CPU, its placement group the one bundle, and a child actor
  started there holds that CPU;
- Tune's scheduler name ``"asynchyperband"`` runs ASHA: the worse trial stops at the first rung.

Both jobs fail on the code before this change (the spec is refused before Tune starts).
"""

from __future__ import annotations

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


def _cpu(resources: dict) -> float:
    return sum(v for k, v in resources.items() if k == "CPU" or k.startswith("CPU_group_"))


def test_pb2_mutates_nested_bounds_in_trials_with_an_empty_head_bundle(stack, tmp_path):
    lrs = [1, 4]
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("pb2-nested"),
        "tune_testkit.tune_forms:NestedLrModel",
        param_space={"opt": {"lr": {"grid_search": lrs}}, "marker_dir": str(tmp_path)},
        stop={"training_iteration": 3},
        resources=[{}, {"CPU": 1}],
        scheduler={
            "name": "pb2",
            "args": {
                "time_attr": "training_iteration",
                "perturbation_interval": 2,
                "hyperparam_bounds": {"opt": {"lr": [0.5, 4]}},
                "quantile_fraction": 0.5,
                "synch": True,
            },
        },
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert manifest["num_trials"] == 2 and manifest["num_terminated"] == 2
    assert_best(manifest, "loss", "min")
    # PB2 read the nested bounds: the worst trial took the best one's checkpoint, with a new opt.lr from PB2's model.
    loads = [m for m in read_markers(str(tmp_path), "load") if m["source_trial"] != m["trial_id"]]
    assert loads, read_markers(str(tmp_path), "load")
    assert all(0.5 <= m["lr"] <= 4 for m in loads)
    assert all(0.5 <= t["config"]["opt"]["lr"] <= 4 for t in manifest["trials"])
    # The empty head bundle: the trainable holds nothing, its group is the one CPU bundle, which a child holds.
    setups = read_markers(str(tmp_path), "setup")
    assert len(setups) >= 3  # two trials, and the one that took the other's checkpoint anew
    for setup in setups:
        assert _cpu(setup["own"]) == 0, setup
        assert [{k: v for k, v in b.items() if k != "bundle"} for b in setup["bundles"]] == [{"CPU": 1.0}], setup
        assert _cpu(setup["child"]) == 1, setup


def test_tunes_name_asynchyperband_runs_asha(stack, tmp_path):
    """One trial at a time: the good trial reaches max_t 4; the bad one is below the first rung's cutoff (the good
    one's loss at iteration 1) and ASHA stops it there. FIFO would run both to 4."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("asynchyperband"),
        "tune_testkit.classes:Stepper",
        param_space={"x": {"grid_search": [3, -2]}, "marker_dir": str(tmp_path)},
        max_concurrent_trials=1,
        stop={"training_iteration": 6},
        scheduler={
            "name": "asynchyperband",
            "args": {"time_attr": "training_iteration", "max_t": 4, "grace_period": 1, "reduction_factor": 2},
        },
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    iters = {t["config"]["x"]: t["metrics"]["training_iteration"] for t in manifest["trials"]}
    assert iters == {3: 4, -2: 1}, iters
