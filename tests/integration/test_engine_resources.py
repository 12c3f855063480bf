"""Per-trial resources as a real Ray job: placement-group bundles with a child actor in the trial's group, a custom
resource in the dict form, and a Class trainable's own default_resource_request."""

from __future__ import annotations

import pytest

from tests.integration.test_engine_forms import assert_best
from tests.support import engine_jobs as jobs
from tests.support.tune_testkit.markers import read_markers

pytestmark = pytest.mark.timeout(180)


def _amount(resources: dict, name: str) -> float:
    """The amount of ``name`` a task holds (Ray 2.60 reports plain names here, also inside a placement group)."""
    return sum(v for k, v in resources.items() if k == name or k.startswith(f"{name}_group_"))


@pytest.mark.parametrize(
    ("bundles", "child_resources", "child_resource_name"),
    [
        ([{"CPU": 1}, {"CPU": 1}], {"num_cpus": 1}, "CPU"),
        ([{"CPU": 1}, {"accel": 1}], {"num_cpus": 0, "resources": {"accel": 1}}, "accel"),
    ],
    ids=["cpu-bundles", "accel-bundle"],
)
def test_child_actor_runs_in_the_trials_placement_group(stack, tmp_path, bundles, child_resources, child_resource_name):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("pg"),
        "tune_testkit.resources:with_child_actor",
        param_space={
            "x": {"grid_search": [1, 3]},
            "child_resources": {"const": child_resources},
            "marker_dir": str(tmp_path),
        },
        resources={"bundles": bundles},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert [t["metrics"]["same_pg"] for t in manifest["trials"]] == [1.0, 1.0]
    children = read_markers(str(tmp_path), "child")
    assert len(children) == 2
    for child in children:
        assert child["bundles"] == bundles, "the trial's placement group has the spec's bundles"
        assert child["child"]["pg"] == child["trainable_pg"]
        # The child holds its resource from bundle 1 of the trial's group (with 2 CPUs on the cluster, both held by
        # the group in the cpu case, it could run nowhere else).
        assert _amount(child["child"]["resources"], child_resource_name) == 1


def test_custom_resource_in_the_dict_form_limits_concurrency(stack, tmp_path):
    """{"cpu": 0.5, "accel": 2}: the CPUs would fit 4 trials at once, the cluster's 2 accel fit one."""
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("accel"),
        "tune_testkit.resources:record_resources",
        param_space={"x": {"grid_search": [2, 3, 5]}, "sleep": 1.0, "marker_dir": str(tmp_path)},
        resources={"cpu": 0.5, "accel": 2},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert [t["metrics"]["accel"] for t in manifest["trials"]] == [2, 2, 2]
    ran = read_markers(str(tmp_path), "ran")
    assert len(ran) == 3
    spans = sorted((m["begin"], m["end"]) for m in ran)
    for (_, end), (begin, _) in zip(spans, spans[1:], strict=False):
        assert begin >= end, f"two trials held accel=2 at once: {spans}"
    assert all(_amount(m["resources"], "CPU") == 0.5 for m in ran)


def test_class_default_resource_request_is_used_without_spec_resources(stack, tmp_path):
    spec = jobs.base_spec(
        stack,
        jobs.unique_name("default-res"),
        "tune_testkit.classes:WantsAccel",
        param_space={"x": {"grid_search": [3, 4]}, "marker_dir": str(tmp_path)},
    )
    _, manifest = jobs.run_ok(stack, spec)
    assert_best(manifest, "loss", "min")
    assert manifest["best_config"]["x"] == 3
    assert [t["metrics"]["accel"] for t in manifest["trials"]] == [1, 1]
    for marker in read_markers(str(tmp_path), "assigned"):
        assert _amount(marker["resources"], "accel") == 1 and _amount(marker["resources"], "CPU") == 1
