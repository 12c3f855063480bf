"""docs/operators/search-space.rst's "Where it differs from Tune's defaults", at the level of Tune's configs: the
RunConfig, TuneConfig, CheckpointConfig, FailureConfig and SyncConfig the engine builds differ from a plain
``Tuner``'s built with the same settings in the fields the list names, and in no other; the engine's own callbacks
run first, then the spec's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ray import tune
from ray.tune.execution import class_cache
from ray.tune.logger import CSVLoggerCallback
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray.tune.search.concurrency_limiter import ConcurrencyLimiter

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import build, compat
from airflow_tune.engine.trial_output import apply_trial_output
from airflow_tune.engine.tuner import build_tuner

pytestmark = pytest.mark.unit

BASE = {"trainable": "m:f", "name": "exp", "metric": "loss", "mode": "min"}


def _built(tmp_path, **fields: Any) -> tuple[tune.RunConfig, tune.TuneConfig]:
    spec = ExperimentSpec.from_dict({**BASE, "storage_path": str(tmp_path), **fields})
    marker = tune.Callback()
    run_config, tune_config = build.build_run_config(spec, [marker]), build.build_tune_config(spec)
    apply_trial_output(run_config, tune_config, spec)
    assert run_config.callbacks == [marker]  # the engine's own, given first by build_tuner (the spec's none here)
    return run_config, tune_config


def _differing(built: Any, plain: Any, skip: tuple[str, ...] = ()) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(built, f.name), getattr(plain, f.name))
        for f in dataclasses.fields(plain)
        if f.name not in skip and getattr(built, f.name) != getattr(plain, f.name)
    }


def test_a_default_spec_differs_from_a_plain_tuner_only_where_the_list_says(tmp_path):
    run_config, tune_config = _built(tmp_path)
    plain_run = tune.RunConfig()
    differing = _differing(run_config, plain_run, skip=("checkpoint_config", "failure_config", "sync_config"))
    # Listed: the name and storage, verbose=0, log_to_file on, the engine's callbacks, and stop (none here).
    assert set(differing) == {"name", "storage_path", "verbose", "log_to_file", "callbacks"}, differing
    assert differing["verbose"][0] == 0 and differing["log_to_file"][0] is True
    assert _differing(run_config.checkpoint_config, tune.CheckpointConfig()) == {}
    assert _differing(run_config.failure_config, tune.FailureConfig()) == {}
    assert _differing(run_config.sync_config, tune.SyncConfig()) == {}
    plain_tune = tune.TuneConfig(metric="loss", mode="min")
    differing = _differing(tune_config, plain_tune, skip=("search_alg", "scheduler"))
    assert differing == {}, differing
    # The search algorithm is Tune's default one, built by the engine (see below for its concurrency limit).
    assert type(tune_config.search_alg) is BasicVariantGenerator
    assert type(tune_config.scheduler).__name__ == "FIFOScheduler"


def test_the_settings_a_user_gives_reach_tunes_configs_as_given(tmp_path):
    run_config, tune_config = _built(
        tmp_path,
        num_samples=3,
        time_budget_s=30,
        reuse_actors=True,
        max_concurrent_trials=2,
        stop={"training_iteration": 4},
        checkpoint={"num_to_keep": 2, "score_attribute": "loss", "score_order": "min"},
        failure={"max_failures": 2},
        sync_artifacts=True,
    )
    plain = tune.TuneConfig(metric="loss", mode="min", num_samples=3, time_budget_s=30, reuse_actors=True)
    # max_concurrent_trials goes to the generator: Tune ignores the TuneConfig's for a generator it did not build.
    assert _differing(tune_config, plain, skip=("search_alg", "scheduler")) == {}
    assert tune_config.search_alg.max_concurrent == 2
    assert run_config.stop == {"training_iteration": 4}
    assert _differing(run_config.checkpoint_config, tune.CheckpointConfig(2, "loss", "min")) == {}
    assert _differing(run_config.failure_config, tune.FailureConfig(max_failures=2)) == {}
    assert _differing(run_config.sync_config, tune.SyncConfig(sync_artifacts=True)) == {}


def test_a_named_searcher_gets_the_limit_through_tunes_concurrency_limiter(tmp_path):
    _, tune_config = _built(tmp_path, max_concurrent_trials=2, search="optuna")
    assert isinstance(tune_config.search_alg, ConcurrencyLimiter) and tune_config.search_alg.max_concurrent == 2


def _train(config: dict[str, Any]) -> None:
    tune.report({"loss": 1.0})


def test_the_engines_own_callbacks_come_first_then_the_specs(tmp_path, monkeypatch):
    # build_tuner keeps the driver's AWS_* out of Tune's set of variables it propagates: leave the set as it was.
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", set(class_cache.ENV_VARS_TO_PROPAGATE))
    trainable = f"{__name__}:_train"
    spec = ExperimentSpec.from_dict(
        {**BASE, "trainable": trainable, "storage_path": str(tmp_path), "callbacks": ["csv"]}
    )
    ours = tune.Callback()
    tuner, restored = build_tuner(spec, [ours])
    callbacks = compat.tuner_run_config(tuner).callbacks
    assert not restored and callbacks[0] is ours and [type(c) for c in callbacks[1:]] == [CSVLoggerCallback]
