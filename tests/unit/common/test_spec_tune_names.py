"""Forms plain Tune runs are accepted by the spec as Tune runs them (issue 33): Tune's own scheduler and searcher
names (``SCHEDULER_IMPORT``, ``SEARCH_ALG_IMPORT``), an empty head bundle, PB2's nested ``hyperparam_bounds`` and
MedianStoppingRule's ``grace_period: 0``. Tune's names the spec takes only through a factory are refused naming why.

Each acceptance test fails on the code before this change (it refused every one of these forms).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.arguments import (
    SCHEDULER_ALIASES,
    SCHEDULERS,
    SCHEDULERS_BY_FACTORY,
    SEARCHER_ALIASES,
    SEARCHERS,
    SEARCHERS_BY_FACTORY,
)

BASE: dict[str, Any] = {
    "trainable": "my_pkg.train:train_fn",
    "name": "exp-1",
    "storage_path": "s3://my-bucket/experiments",
    "metric": "loss",
    "mode": "min",
    "param_space": {"lr": {"loguniform": [1e-4, 1e-1]}},
}


def spec(**patch: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, **patch})


def refused(**patch: Any) -> str:
    with pytest.raises(SpecError) as info:
        spec(**patch)
    return str(info.value)


def _ray_names(relative: str, variable: str) -> set[str]:
    """The keys of a dict literal ``variable`` in Ray's source (read, not imported)."""
    found = importlib.util.find_spec("ray")
    assert found is not None and found.origin is not None
    tree = ast.parse((Path(found.origin).parent / relative).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            return {ast.literal_eval(k) for k in node.value.keys if k is not None}
    raise AssertionError(f"{variable} not found in ray/{relative}")


def test_every_scheduler_name_tune_takes_is_a_name_an_alias_or_a_factory_with_why():
    names = _ray_names("tune/schedulers/__init__.py", "SCHEDULER_IMPORT")
    assert {"asynchyperband", "medianstopping", "hb_bohb"} <= names  # read the right table
    for name in names:
        assert name in SCHEDULERS or name in SCHEDULER_ALIASES or name in SCHEDULERS_BY_FACTORY, name
    assert set(SCHEDULER_ALIASES.values()) <= set(SCHEDULERS)


def test_every_searcher_name_tune_takes_is_a_name_an_alias_or_a_factory_with_why():
    names = _ray_names("tune/search/__init__.py", "SEARCH_ALG_IMPORT")
    assert {"variant_generator", "nevergrad"} <= names
    for name in names:
        assert name in SEARCHERS or name in SEARCHER_ALIASES or name in SEARCHERS_BY_FACTORY, name
    assert set(SEARCHER_ALIASES.values()) <= set(SEARCHERS)


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("asynchyperband", "asha"),
        ("async_hyperband", "asha"),
        ("AsyncHyperBand", "asha"),
        ("medianstopping", "median_stopping_rule"),
        ("median_stopping_rule", "median_stopping_rule"),
    ],
)
def test_tunes_scheduler_names_are_accepted(given, canonical):
    built = spec(scheduler=given)
    assert built.scheduler.canonical_name == canonical
    # Arguments are checked as the canonical scheduler's.
    assert f"not an argument of {canonical}" in refused(scheduler={"name": given, "args": {"grace_periods": 3}})


def test_resource_changing_is_tunes_default_by_name_and_its_code_arguments_a_factorys():
    assert spec(scheduler="resource_changing").scheduler.canonical_name == "resource_changing"
    message = refused(
        scheduler={"name": "resource_changing", "args": {"base_scheduler": "asha", "resources_allocation_function": 1}}
    )
    assert "scheduler.args.base_scheduler = 'asha': resource_changing's base_scheduler is a TrialScheduler" in message
    assert "scheduler.args.resources_allocation_function = 1: " in message and "code, not data" in message
    assert '{"factory": "pkg.mod:make"}' in message


def test_variant_generator_is_the_random_searcher_with_its_arguments():
    built = spec(search={"name": "variant_generator", "args": {"random_state": 7}})
    assert built.search.name == "random"
    assert spec(search="variant_generator").fingerprint() == spec(search="random").fingerprint()
    assert "not an argument of random" in refused(search={"name": "variant_generator", "args": {"seed": 1}})


@pytest.mark.parametrize("name", sorted(SCHEDULERS_BY_FACTORY))
def test_tune_scheduler_names_reached_through_a_factory_say_why_and_how(name):
    message = refused(scheduler=name)
    assert f"scheduler.name = '{name}'" in message
    assert SCHEDULERS_BY_FACTORY[name] in message and '{"factory": "pkg.mod:make"}' in message


@pytest.mark.parametrize("name", sorted(SEARCHERS_BY_FACTORY))
def test_tune_searcher_names_reached_through_a_factory_say_why_and_how(name):
    message = refused(search=name)
    assert f"search.name = '{name}'" in message
    assert SEARCHERS_BY_FACTORY[name] in message and '{"factory": "pkg.mod:make"}' in message


@pytest.mark.parametrize("head", [{}, {"CPU": 0}, {"cpu": 0, "gpu": 0}])
def test_an_empty_head_bundle_is_tunes(head):
    built = spec(resources=[head, {"CPU": 1}, {"CPU": 1}])
    assert built.resources is not None and built.resources.bundles == [head, {"CPU": 1}, {"CPU": 1}]


@pytest.mark.parametrize(
    ("bundles", "field", "words"),
    [
        # Tune raises "Cannot initialize a ResourceRequest with an empty head and zero worker bundles".
        ([{}], "resources.bundles[0]", "an empty first bundle needs others after it"),
        ([{"CPU": 0}], "resources.bundles[0]", "asks for no resources at all"),
        # Only the head may be empty: Ray refuses an empty bundle of a placement group.
        ([{"CPU": 1}, {}], "resources.bundles[1]", "must be a non-empty object"),
        ([{}, {"CPU": 0}], "resources.bundles[1]", "asks for no resources at all"),
        ([{}, {"CPU": 1}], None, None),
        ([{"bundle": 0}, {"CPU": 1}], "resources.bundles[0].bundle", "placement group's own resource"),
    ],
)
def test_only_the_first_of_several_bundles_may_be_empty(bundles, field, words):
    if field is None:
        spec(resources=bundles)
        return
    message = refused(resources=bundles)
    assert f"{field} = " in message and words in message


def test_pb2_takes_nested_bounds_as_tune_does():
    bounds = {"lr": [1e-4, 0.1], "net": {"dropout": [0.0, 0.5], "head": {"width": [8, 64]}}, "fixed": [1, 1]}
    built = spec(scheduler={"name": "pb2", "args": {"hyperparam_bounds": bounds}})
    assert built.scheduler.args["hyperparam_bounds"] == bounds


@pytest.mark.parametrize(
    ("bounds", "field", "words"),
    [
        ({"lr": [0.1, 0.001]}, "hyperparam_bounds.lr", "low 0.1 is above high 0.001"),
        ({"net": {"lr": [1, 2, 3]}}, "hyperparam_bounds.net.lr", "must be [low, high], or an object of bounds"),
        ({"net": {}}, "hyperparam_bounds.net", "must be [low, high], or an object of bounds"),
        ({"net": {"a/b": [0, 1]}}, "hyperparam_bounds.net.a/b", "raises ValueError on a key that holds one"),
        ({"lr": ["a", "b"]}, "hyperparam_bounds.lr", "[low, high]"),
    ],
)
def test_pb2_bounds_tune_refuses_are_refused(bounds, field, words):
    message = refused(scheduler={"name": "pb2", "args": {"hyperparam_bounds": bounds}})
    assert f"scheduler.args.{field} = " in message and words in message


@pytest.mark.parametrize("name", ["median_stopping_rule", "medianstopping"])
def test_median_stopping_takes_grace_period_zero(name):
    assert spec(scheduler={"name": name, "args": {"grace_period": 0}}).scheduler.args == {"grace_period": 0}
    assert "must be a number >= 0" in refused(scheduler={"name": name, "args": {"grace_period": -1}})


def test_asha_grace_period_zero_stays_refused_as_tune_asserts():
    assert "must be a positive number" in refused(scheduler={"name": "asynchyperband", "args": {"grace_period": 0}})


@pytest.mark.parametrize("value", ["raise", "RAISE"])
def test_fail_fast_raise_is_refused_on_purpose_saying_why(value):
    message = refused(failure={"fail_fast": value})
    assert f"failure.fail_fast = '{value}': Tune's 'raise'" in message
    assert "before its final save of the experiment's state" in message and "write true" in message
    assert "must be true or false" not in message


def test_max_concurrent_trials_zero_is_no_limit_as_in_tune():
    """TuneConfig(max_concurrent_trials=0): "If None or 0, no limit will be applied"."""
    from airflow_tune.engine.build import concurrency_limit

    built = spec(max_concurrent_trials=0)
    assert built.max_concurrent_trials == 0 and concurrency_limit(built) is None
    assert concurrency_limit(spec(max_concurrent_trials=0, search={"name": "random", "max_concurrent": 2})) == 2
