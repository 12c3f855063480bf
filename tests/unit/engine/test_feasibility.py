"""Which placement groups a cluster can ever host, and the callback that ends an experiment whose trials ask for
what no node has (after a grace period for autoscalers). Pure logic on a fake clock; the real case runs in
tests/integration/test_infeasible.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_tune.engine.feasibility import FeasibilityCallback, InfeasibleResourcesError, fits

NODES = [{"CPU": 0.0, "memory": 8e9}, {"CPU": 2.0, "accel": 2.0}, {"CPU": 2.0}]


@pytest.mark.parametrize(
    ("bundles", "strategy", "ok"),
    [
        ([{"CPU": 1}], "PACK", True),
        ([{"CPU": 2, "accel": 1}], "PACK", True),
        ([{"GPU": 1}], "PACK", False),
        ([{"CPU": 64}], "PACK", False),
        ([{"accel": 3}], "PACK", False),
        ([{"CPU": 2}, {"CPU": 2}], "PACK", True),  # one on each worker
        ([{"CPU": 2}, {"CPU": 2}], "STRICT_PACK", False),  # 4 CPUs on one node: none has them
        ([{"CPU": 1}, {"CPU": 1}], "STRICT_PACK", True),
        ([{"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD", True),
        ([{"CPU": 1}, {"CPU": 1}, {"CPU": 1}], "STRICT_SPREAD", False),  # two nodes have CPUs
        ([{"CPU": 0, "memory": 1e9}], "PACK", True),
    ],
)
def test_fits(bundles, strategy, ok):
    assert fits(bundles, strategy, NODES) is ok


def _trial(status: str, bundles: list[dict], trial_id: str = "t1") -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=trial_id, status=status, placement_group_factory=SimpleNamespace(bundles=bundles, strategy="PACK")
    )


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_infeasible_trial_fails_the_experiment_after_the_grace_period_naming_what_nodes_offer():
    clock = Clock()
    callback = FeasibilityCallback(30.0, nodes=lambda: NODES, clock=clock)
    trials = [_trial("RUNNING", [{"CPU": 1}], "ok"), _trial("PENDING", [{"CPU": 1, "GPU": 1}], "gpu")]
    callback.on_step_begin(0, trials)  # first seen: the grace period starts
    clock.now = 29.0
    callback.on_step_begin(0, trials)
    clock.now = 31.0
    with pytest.raises(InfeasibleResourcesError) as info:
        callback.on_step_begin(0, trials)
    text = str(info.value)
    assert "trial gpu asks for {'CPU': 1, 'GPU': 1}" in text and "'accel': 2.0" in text and "infeasible_wait_s" in text


def test_a_trial_that_becomes_feasible_resets_the_grace_period():
    clock = Clock()
    nodes = [{"CPU": 2.0}]
    callback = FeasibilityCallback(10.0, nodes=lambda: nodes, clock=clock)
    trials = [_trial("PENDING", [{"CPU": 4}])]
    callback.on_step_begin(0, trials)
    clock.now = 8.0
    nodes.append({"CPU": 8.0})  # the autoscaler added a node
    callback.on_step_begin(0, trials)
    clock.now = 20.0
    callback.on_step_begin(0, trials)  # feasible all along since: no error


def test_pending_trials_that_fit_are_just_waiting():
    clock = Clock()
    callback = FeasibilityCallback(0.0, nodes=lambda: NODES, clock=clock)
    for step in range(10):
        clock.now = step * 5.0
        callback.on_step_begin(0, [_trial("PENDING", [{"CPU": 2}])])
