"""``resources.train_workers`` (the Ray Train workers a trial starts, outside its placement group): the spec's check,
and the feasibility check counting them with each pending trial. Pure logic; the real Train run is in
tests/e2e/test_train_in_trial.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.train_workers import worker_group
from airflow_tune.engine.feasibility import FeasibilityCallback, InfeasibleResourcesError, fits_with_workers

BASE = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
TWO_CPUS = [{"CPU": 2.0, "memory": 8e9}]
TWO_NODES = [{"CPU": 1.0}, {"CPU": 1.0}]


def _spec(resources) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, "resources": resources})


def test_the_short_and_the_full_form_keep_the_workers_beside_the_trials_own_resources():
    workers = {"num_workers": 2, "per_worker": {"cpu": 0.5}}
    short = _spec({"cpu": 0.5, "train_workers": workers}).resources
    assert short is not None and short.per_trial == {"cpu": 0.5} and short.train_workers == workers
    full = _spec({"per_trial": {"cpu": 0.5}, "train_workers": workers}).resources
    assert full == short
    alone = _spec({"train_workers": {"num_workers": 2}}).resources
    assert alone is not None and alone.per_trial is None and alone.bundles is None
    assert worker_group(alone.train_workers) == ([{"CPU": 1.0}, {"CPU": 1.0}], "PACK")  # ScalingConfig's default
    bundles = _spec({"bundles": [{"CPU": 1}], "train_workers": {**workers, "strategy": "SPREAD"}}).resources
    assert bundles is not None and worker_group(bundles.train_workers) == ([{"CPU": 0.5}] * 2, "SPREAD")
    assert worker_group(None) is None


def test_every_problem_of_the_workers_is_named_at_once():
    with pytest.raises(SpecError) as info:
        _spec(
            {
                "cpu": 1,
                "train_workers": {
                    "num_workers": 0,
                    "per_worker": {"cpu": -1, "node:10.0.0.1": 0.01},
                    "strategy": "ROUND_ROBIN",
                    "workers": 2,
                },
            }
        )
    text = str(info.value)
    for expected in (
        "resources.train_workers.workers = 2: unknown field",
        "resources.train_workers.num_workers = 0: must be an integer >= 1",
        "resources.train_workers.per_worker.cpu = -1: must be a number >= 0",
        "resources.train_workers.per_worker.node:10.0.0.1 = 0.01: a node pin is not taken here",
        "resources.train_workers.strategy = 'ROUND_ROBIN': unknown strategy",
    ):
        assert expected in text, text
    with pytest.raises(SpecError, match=r"resources.train_workers = 2: must be a JSON object"):
        _spec({"cpu": 1, "train_workers": 2})


@pytest.mark.parametrize(
    ("bundles", "workers", "nodes", "ok"),
    [
        ([{"CPU": 1}], None, TWO_CPUS, True),
        ([{"CPU": 1}], ([{"CPU": 0.5}] * 2, "PACK"), TWO_CPUS, True),  # 1 + 2 x 0.5 on 2 CPUs
        ([{"CPU": 1}], ([{"CPU": 1}] * 2, "PACK"), TWO_CPUS, False),  # 3 CPUs on 2: the workers are counted
        ([{"CPU": 0.5}], ([{"CPU": 1}] * 2, "STRICT_PACK"), TWO_CPUS, False),
        ([{"CPU": 0.5}], ([{"CPU": 1}] * 2, "STRICT_PACK"), [{"CPU": 2.0}, {"CPU": 1.0}], True),
        ([{"CPU": 0.5}], ([{"CPU": 1}] * 2, "STRICT_SPREAD"), TWO_NODES, False),  # the driver needs some room too
        ([{"CPU": 0.5}], ([{"CPU": 0.5}] * 2, "STRICT_SPREAD"), TWO_NODES, True),
        ([{"CPU": 1}], ([{"GPU": 1}] * 2, "PACK"), TWO_CPUS, False),
    ],
)
def test_fits_with_workers(bundles, workers, nodes, ok):
    assert fits_with_workers(bundles, "PACK", workers, nodes) is ok


def _trial(bundles: list[dict], status: str = "PENDING") -> SimpleNamespace:
    return SimpleNamespace(
        trial_id="t1", status=status, placement_group_factory=SimpleNamespace(bundles=bundles, strategy="PACK")
    )


def test_the_callback_from_a_spec_fails_a_trial_whose_workers_cannot_fit_naming_them():
    spec = _spec({"cpu": 1, "train_workers": {"num_workers": 2, "per_worker": {"cpu": 1}}})
    callback = FeasibilityCallback.for_spec(spec)
    callback.nodes = lambda: TWO_CPUS
    with pytest.raises(InfeasibleResourcesError) as info:
        callback.on_step_begin(0, [_trial([{"CPU": 1.0}])])
    text = str(info.value)
    assert text.startswith("trial t1 asks for {'CPU': 1.0} (PACK) and its 2 Train workers {'CPU': 1.0} each (PACK"), (
        text
    )
    assert "resources_per_trial.train_workers" in text and "the cluster's nodes cannot hold" in text, text
    assert "1 trial(s) cannot run with their Train workers" in text, text
    # A trial whose own resources fit starts at once, and its workers ask only then: a running one fails too.
    running = FeasibilityCallback.for_spec(spec)
    running.nodes = lambda: TWO_CPUS
    with pytest.raises(InfeasibleResourcesError, match="and its 2 Train workers"):
        running.on_step_begin(0, [_trial([{"CPU": 1.0}], "RUNNING")])
    # The same trial without workers declared fits: only the declared workers made it infeasible.
    plain = FeasibilityCallback.for_spec(_spec({"cpu": 1}))
    plain.nodes = lambda: TWO_CPUS
    plain.on_step_begin(0, [_trial([{"CPU": 1.0}])])
    assert plain.train_workers is None
    # Without workers, a running trial is not looked at: it holds what it asked for.
    plain = FeasibilityCallback.for_spec(_spec({"cpu": 1}))
    plain.nodes = lambda: []
    plain.on_step_begin(0, [_trial([{"CPU": 1.0}], "RUNNING")])
