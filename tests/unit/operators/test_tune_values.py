"""Tune's own forms of the operator's data arguments give the spec Tune would run (issue 33, the differences audit):
a ``PlacementGroupFactory`` as ``resources_per_trial``, Tune's ``custom_resources`` dict key, a ``timedelta`` or 0 as
``time_budget_s``; and what Tune would refuse or the spec cannot carry is refused before submission, naming the fix:
a Tune scheduler or searcher object, ``checkpoint.frequency``/``at_end`` with a function trainable."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from ray import tune
from ray.tune.logger import CSVLoggerCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.basic_variant import BasicVariantGenerator

from airflow_tune.common.spec import ExperimentSpec, SpecError
from tests.unit.operators.test_argument_forms import _spec_with

pytestmark = pytest.mark.unit


def _train(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0})


class _Saving(tune.Trainable):
    def step(self) -> dict[str, float]:
        return {"loss": 1.0}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        return None


@pytest.mark.parametrize(
    ("factory", "bundles", "strategy"),
    [
        (tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": 1, "GPU": 0}]), [{"CPU": 1}, {"CPU": 1}], "PACK"),
        (tune.PlacementGroupFactory([{}, {"CPU": 1}], strategy="SPREAD"), [{}, {"CPU": 1}], "SPREAD"),
    ],
    ids=["bundles", "empty-head-spread"],
)
def test_a_placement_group_factory_is_the_bundles_it_holds(factory, bundles, strategy):
    # Tune's PlacementGroupFactory is callable: Airflow's renderer called it with context= (TypeError) before.
    spec = _spec_with(resources_per_trial=factory)
    written = _spec_with(resources_per_trial={"bundles": bundles, "strategy": strategy})
    assert spec.resources == written.resources
    assert spec.resources.bundles == bundles and spec.resources.strategy == strategy
    assert spec.fingerprint() == written.fingerprint()


def test_a_placement_group_factory_with_other_placement_group_arguments_is_refused():
    with pytest.raises(TypeError, match=r"resources_per_trial = .*lifetime cannot be carried.*list of dicts"):
        _spec_with(resources_per_trial=tune.PlacementGroupFactory([{"CPU": 1}], lifetime="detached"))


def test_tunes_custom_resources_key_is_the_same_bundle():
    spec = _spec_with(resources_per_trial={"cpu": 1, "custom_resources": {"accel": 1}})
    assert spec.resources.per_trial == {"cpu": 1, "accel": 1}
    assert spec.fingerprint() == _spec_with(resources_per_trial={"cpu": 1, "accel": 1}).fingerprint()


def test_a_timedelta_budget_is_its_seconds_and_zero_is_none():
    assert _spec_with(time_budget_s=datetime.timedelta(minutes=2)).time_budget_s == 120.0
    # Tune sets no budget for a falsy time_budget_s, as max_concurrent_trials=0 is no limit.
    assert _spec_with(time_budget_s=0).time_budget_s is None
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bkt/p", "metric": "loss", "mode": "min"}
    with pytest.raises(SpecError, match=r"num_samples = -1: samples without end"):
        ExperimentSpec.from_dict({**base, "num_samples": -1, "time_budget_s": 0})
    with pytest.raises(SpecError, match=r"time_budget_s = -1: must be a positive number.*0 or null for none"):
        ExperimentSpec.from_dict({**base, "time_budget_s": -1})


@pytest.mark.parametrize(
    ("argument", "value", "example"),
    [
        ("scheduler", ASHAScheduler(max_t=10), "scheduler={'name': 'asha'"),
        ("search", BasicVariantGenerator(), "search={'name': 'optuna'"),
    ],
)
def test_a_tune_scheduler_or_searcher_object_is_refused_naming_the_forms(argument, value, example):
    with pytest.raises(TypeError, match=rf"{argument} = \w+\(\.\.\.\): a Tune {argument} object is not taken") as info:
        _spec_with(**{argument: value})
    assert example in str(info.value) and f"{argument}={{'factory': 'pkg.mod:make'" in str(info.value)


@pytest.mark.parametrize("checkpoint", [{"frequency": 2}, {"at_end": True}])
def test_checkpoint_frequency_or_at_end_with_a_function_trainable_is_refused_at_submit(checkpoint):
    # Tune's Experiment raises on them for a function trainable, on the cluster; the engine did too, after submission.
    with pytest.raises(ValueError, match=r"checkpoint = .*Class API trainables only.*'_train' is a function"):
        _spec_with(trainable=_train, checkpoint=checkpoint)
    assert _spec_with(trainable=_Saving, checkpoint=checkpoint).checkpoint.frequency == checkpoint.get("frequency", 0)
    assert _spec_with(trainable=_train, checkpoint={"num_to_keep": 2, "at_end": False}).checkpoint.num_to_keep == 2


def _train_on_two(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0})


def _train_by_config(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0})


def test_resources_set_by_tune_with_resources_on_an_importable_function_reach_the_spec():
    # with_resources sets them on the function object; the cluster imports the function by name, without them.
    trainable = tune.with_resources(_train_on_two, {"cpu": 2})
    spec = _spec_with(trainable=trainable)
    assert spec.trainable == "tests.unit.operators.test_tune_values:_train_on_two"
    assert spec.resources.bundles == [{"CPU": 2.0}]
    with pytest.raises(ValueError, match=r"carries resources from tune.with_resources and resources_per_trial"):
        _spec_with(trainable=trainable, resources_per_trial={"cpu": 1})
    by_config = tune.with_resources(_train_by_config, lambda config: {"cpu": 1})
    with pytest.raises(TypeError, match=r"function of the config is lost on a trainable the cluster imports by name"):
        _spec_with(trainable=by_config)


class _Counting(tune.Callback):
    pass


@pytest.mark.parametrize(
    ("callback", "fix"),
    [
        (CSVLoggerCallback(), "write Tune's logger by name, 'csv'"),
        (_Counting(), "{'factory': 'tests.unit.operators.test_tune_values:_Counting', 'args': {...}}"),
    ],
    ids=["tune-logger", "custom"],
)
def test_a_callback_object_is_refused_naming_the_specs_form(callback, fix):
    # Before: "must be a name, an import path or an object" (a JSON object), for an object.
    with pytest.raises(
        TypeError, match=r"callbacks\[1\] = \w+\(\.\.\.\): a callback object or class is not taken"
    ) as info:
        _spec_with(callbacks=["json", callback])
    assert fix in str(info.value)


def test_a_name_tunes_registry_holds_is_refused_naming_the_import_path_to_write():
    base = {"name": "e", "storage_path": "s3://bkt/p", "metric": "loss", "mode": "min"}
    with pytest.raises(
        SpecError, match=r"trainable = 'PPO': not an import path.*registry.*\"ray.rllib.algorithms.ppo:PPO\""
    ):
        ExperimentSpec.from_dict({**base, "trainable": "PPO"})


def test_param_space_constants_reach_the_spec_as_json_gives_them_back():
    # Listed as a difference: a tuple reaches the trial as a list; what JSON cannot hold is refused naming the fix.
    assert _spec_with(param_space={"shape": (3, 3), "acts": tune.choice([(1, 2)])}).param_space == {
        "shape": [3, 3],
        "acts": {"choice": [[1, 2]]},
    }
    for value, words in [(float("nan"), "not a finite number"), ({1, 2}, "type set is not JSON")]:
        with pytest.raises(SpecError, match=words):
            _spec_with(param_space={"x": value})


class _NotSaving(tune.Trainable):
    def step(self) -> dict[str, float]:
        return {"loss": 1.0}


def test_checkpoint_frequency_with_a_class_that_cannot_save_is_refused_at_submit():
    # Tune errs every trial with NotImplementedError at its first checkpoint; the engine refused it on the cluster.
    with pytest.raises(ValueError, match=r"'_NotSaving'.*does not implement save_checkpoint"):
        _spec_with(trainable=_NotSaving, checkpoint={"frequency": 1})
    assert _spec_with(trainable=_NotSaving, checkpoint={"num_to_keep": 1}).checkpoint.num_to_keep == 1
