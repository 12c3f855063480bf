"""A trial that asks for resources no node has fails the experiment within seconds, naming the resource and what
the nodes offer, and the job ends (no hang until execution_timeout). Real Ray head with 2 CPUs and 2 "accel"."""

from __future__ import annotations

import time

import pytest

from tests.support.engine_jobs import base_spec, run, unique_name

pytestmark = [pytest.mark.usefixtures("stack"), pytest.mark.timeout(180)]


@pytest.mark.parametrize(
    ("resources", "asked"),
    [
        ({"cpu": 1, "gpu": 1}, "'GPU': 1"),
        ({"cpu": 64}, "'CPU': 64"),
        ([{"CPU": 1}, {"accel": 5}], "'accel': 5"),
    ],
    ids=["gpu", "64-cpus", "custom-bundle"],
)
def test_an_infeasible_trial_fails_fast_naming_the_resource_and_the_nodes(stack, resources, asked):
    spec = base_spec(
        stack,
        unique_name("infeasible"),
        "tune_testkit.functions:quadratic",
        param_space={"x": {"grid_search": [1]}},
        resources=resources,
    )
    started = time.monotonic()
    status, logs, manifest = run(stack, spec, timeout=120)
    took = time.monotonic() - started
    assert status == "FAILED", logs[-3000:]
    [verdict] = [line for line in logs.splitlines() if line.startswith("[airflow-tune] verdict: ")]
    assert "failed: InfeasibleResourcesError: trial " in verdict and asked in verdict, verdict
    assert "'accel': 2.0" in verdict and "'CPU': 2.0" in verdict, verdict  # what the node offers
    assert manifest is None
    print(f"infeasible {resources}: failed after {took:.1f}s")
