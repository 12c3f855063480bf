"""Tune's other names of the schedulers and searchers the docs name, each run once as a real Ray job (the canonical
names run in test_engine_search.py, test_searchers.py and test_tune_forms.py): ``async_hyperband`` with the searcher
``grid``, and ``medianstopping`` with the searcher ``variant_generator``. One trial at a time over a grid of a good x
and a bad one: the scheduler stops the bad trial at its first result, where FIFO would run it to the stop. And
``resource_changing`` by name (Tune's defaults: a FIFO base, ``DistributeResources``), which the factory test runs
only as a factory: the one trial starts on 1 CPU and is resumed from its checkpoint on both of the head's CPUs."""

from __future__ import annotations

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    ("scheduler", "args", "search"),
    [
        ("async_hyperband", {"max_t": 4, "grace_period": 1, "reduction_factor": 2}, "grid"),
        ("medianstopping", {"grace_period": 1, "min_samples_required": 1}, "variant_generator"),
    ],
)
def test_tunes_other_names_run_their_scheduler_and_searcher(stack, tmp_path, scheduler, args, search):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name(scheduler.replace("_", "-")),
        "tune_testkit.classes:Stepper",
        param_space={"x": {"grid_search": [3, -2]}, "marker_dir": str(tmp_path)},
        max_concurrent_trials=1,
        stop={"training_iteration": 4},
        scheduler={"name": scheduler, "args": {"time_attr": "training_iteration", **args}},
        search=search,
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    iters = {t["config"]["x"]: t["metrics"]["training_iteration"] for t in manifest["trials"]}
    assert iters == {3: 4, -2: 1}, iters


def test_tunes_name_resource_changing_gives_the_trial_the_free_cpu(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("resource-changing-name"),
        "tune_testkit.factories:resumable",
        param_space={"x": 2.0, "net": {"width": 3}, "marker_dir": str(tmp_path)},
        scheduler="resource_changing",
    )
    _, manifest = jobs.run_ok(stack, spec)
    runs = read_markers(str(tmp_path), "run")
    assert runs[0]["start"] == 0 and runs[0]["cpus"] == 1, runs
    assert any(r["start"] > 0 and r["cpus"] == 2 for r in runs[1:]), runs
    assert manifest["best_metrics"]["training_iteration"] == 4 and manifest["best_metrics"]["cpus"] == 2
