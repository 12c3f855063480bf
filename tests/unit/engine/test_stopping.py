"""The spec's ``stop``, pure logic: Tune's dict form kept as it was (same identity), the list form's thresholds in both
directions and Tune's stoppers by name, every refusal naming the field and the fix, the static table against the
installed Ray's signatures, and the engine's stoppers as Tune runs them (and pickles them into ``tuner.pkl``)."""

from __future__ import annotations

import inspect
import pickle
from typing import Any

import pytest
from ray import cloudpickle
from ray.tune.stopper import CombinedStopper, ExperimentPlateauStopper, TrialPlateauStopper

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.stopping import STOPPER_CLASSES, STOPPERS, experiment_stoppers
from airflow_tune.engine import stopping as engine_stopping
from airflow_tune.engine.imports import EngineError

BASE = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
COMBINED = [
    {"metric": "loss", "below": 0.1},
    {"metric": "acc", "above": 0.9},
    {"name": "trial_plateau", "args": {"std": 0.01, "num_results": 4, "grace_period": 4}},
    {"name": "TrialPlateauStopper", "args": {"metric": "acc", "metric_threshold": 0.5, "mode": "max"}},
    {"name": "experiment_plateau", "args": {"std": 1, "top": 3, "patience": 2}},
    {"name": "maximum_iteration", "args": {"max_iter": 10}},
    {"name": "timeout", "args": {"timeout": 60.5}},
]


def _spec(**fields: Any) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, **fields})


def _errors(**fields: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        _spec(**fields)
    return info.value.errors


def test_tunes_dict_form_is_kept_as_it_is_and_keeps_its_identity():
    spec = _spec(stop={"training_iteration": 10, "done": True})
    assert spec.to_dict()["stop"] == {"training_iteration": 10, "done": True}
    # The identity holds the dict verbatim and nothing the list form or callbacks added: fingerprints of existing
    # experiments stay what they were.
    assert spec.identity() == {
        "trainable": "m:f",
        "param_space": {},
        "trainable_kwargs": {},
        "metric": "loss",
        "mode": "min",
        "num_samples": 1,
        "stop": {"training_iteration": 10, "done": True},
        "scheduler": {"name": "fifo", "factory": None, "args": {}},
        "search": {"name": "random", "factory": None, "args": {}, "max_concurrent": None},
    }
    assert spec.fingerprint() == _spec(stop={"training_iteration": 10, "done": True}, callbacks=["csv"]).fingerprint()
    assert engine_stopping.build_stop(spec) == {"training_iteration": 10, "done": True}


def test_the_list_form_is_part_of_the_identity():
    assert _spec(stop=COMBINED).fingerprint() != _spec(stop=COMBINED[:1]).fingerprint()
    assert _spec(stop=COMBINED).to_dict()["stop"] == COMBINED


REFUSED = [
    ("empty-list", [], "stop", ["must be an object of metric thresholds or a non-empty list", "null"]),
    ("criterion-unlisted", {"metric": "loss", "below": 0.1}, "stop", ["one criterion of the list form", "stop=[{"]),
    ("threshold-string", {"loss": "0.1"}, "stop.loss", ["must be a number", "list form"]),
    ("entry-number", [10], "stop[0]", ["must be an object"]),
    ("entry-neither", [{"foo": 1}], "stop[0]", ["neither a threshold nor a stopper"]),
    ("no-direction", [{"metric": "loss"}], "stop[0]", ["exactly one of above or below"]),
    ("both-directions", [{"metric": "loss", "below": 0.1, "above": 1}], "stop[0]", ["exactly one of above or below"]),
    ("typo-direction", [{"metric": "loss", "bellow": 0.1}], "stop[0].bellow", ["did you mean 'below'"]),
    ("value-string", [{"metric": "loss", "below": "0.1"}], "stop[0].below", ["must be a number"]),
    ("metric-empty", [{"metric": "", "above": 1}], "stop[0].metric", ["must be a metric name"]),
    ("stopper-unknown", [{"name": "trial_plato"}], "stop[0].name", ["did you mean 'trial_plateau'"]),
    ("stopper-key", [{"name": "timeout", "arg": {}}], "stop[0].arg", ["did you mean 'args'"]),
    ("args-list", [{"name": "timeout", "args": [60]}], "stop[0].args", ["must be a JSON object"]),
    ("arg-typo", [{"name": "trial_plateau", "args": {"stdd": 0.1}}], "stop[0].args.stdd", ["did you mean 'std'"]),
    ("std-zero", [{"name": "trial_plateau", "args": {"std": 0}}], "stop[0].args.std", ["a number > 0"]),
    ("num-results", [{"name": "trial_plateau", "args": {"num_results": 0}}], "stop[0].args.num_results", [">= 1"]),
    ("grace", [{"name": "trial_plateau", "args": {"grace_period": -1}}], "stop[0].args.grace_period", [">= 0"]),
    (
        "threshold-kind",
        [{"name": "trial_plateau", "args": {"metric_threshold": "high"}}],
        "stop[0].args.metric_threshold",
        ["a number or null"],
    ),
    ("mode", [{"name": "trial_plateau", "args": {"mode": "maximize"}}], "stop[0].args.mode", ['"min", "max"']),
    (
        "threshold-without-mode",
        [{"name": "trial_plateau", "args": {"metric_threshold": 0.5, "mode": None}}],
        "stop[0].args.mode",
        ["needs a mode with a metric_threshold"],
    ),
    ("top", [{"name": "experiment_plateau", "args": {"top": 1}}], "stop[0].args.top", [">= 2"]),
    ("patience", [{"name": "experiment_plateau", "args": {"patience": 1.5}}], "stop[0].args.patience", [">= 0"]),
    ("exp-mode-null", [{"name": "experiment_plateau", "args": {"mode": None}}], "stop[0].args.mode", ['"min" or']),
    ("max-iter-missing", [{"name": "maximum_iteration"}], "stop[0].args", ["needs max_iter"]),
    ("max-iter-zero", [{"name": "maximum_iteration", "args": {"max_iter": 0}}], "stop[0].args.max_iter", [">= 1"]),
    ("timeout-missing", [{"name": "timeout", "args": {}}], "stop[0].args", ["needs timeout"]),
    ("timeout-negative", [{"name": "timeout", "args": {"timeout": -5}}], "stop[0].args.timeout", ["a number > 0"]),
    ("object", [{"name": "timeout", "args": {"timeout": object()}}], "stop[0].args.timeout", ["not JSON data"]),
    (
        "decoder-key",
        [{"name": "timeout", "args": {"timeout": {"_type": "CLOUDPICKLE_FALLBACK", "value": "00"}}}],
        "stop[0].args.timeout",
        ["decodes a mapping with the key '_type' as code"],
    ),
]


@pytest.mark.parametrize(("stop", "path", "words"), [pytest.param(*r[1:], id=r[0]) for r in REFUSED])
def test_each_bad_stop_is_refused_naming_the_field_and_the_fix(stop, path, words):
    errors = _errors(stop=stop)
    named = [e for e in errors if e.split(" = ", 1)[0] == path]
    assert named, f"no problem names {path!r}: {errors}"
    assert any(all(w in e for w in words) for e in named), (words, named)
    assert all("; " in e for e in named)  # problem; fix


def test_every_problem_of_a_stop_list_is_listed_at_once():
    errors = _errors(stop=[{"metric": "loss"}, {"name": "timeout"}, {"name": "trial_plateau", "args": {"std": -1}}])
    assert [e.split(" = ", 1)[0] for e in errors] == ["stop[0]", "stop[1].args", "stop[2].args.std"]


def test_every_valid_form_is_accepted():
    assert _spec(stop=COMBINED).stop == COMBINED
    assert experiment_stoppers(COMBINED) == ["experiment_plateau", "timeout"]
    assert experiment_stoppers({"training_iteration": 1}) == []
    assert _spec(stop=[{"name": "max_iter", "args": {"max_iter": 3}}]).stop is not None  # an alias


# -- the static table against the installed Ray --------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(STOPPERS))
def test_the_stopper_table_is_the_installed_rays_signature(name):
    cls = engine_stopping.CLASSES[name]
    assert cls.__name__ == STOPPER_CLASSES[name]
    params = [p for p in inspect.signature(cls).parameters.values() if p.name != "self"]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert {p.name for p in params} == set(STOPPERS[name]), f"Ray's {cls.__name__} changed: update STOPPERS"
    assert set(engine_stopping.CLASSES) == set(STOPPERS)


# -- the engine's stoppers -----------------------------------------------------------------------------------------
def _feed(stopper: Any, trial_id: str, results: list[dict[str, Any]]) -> list[bool]:
    return [bool(stopper(trial_id, r)) for r in results]


def test_thresholds_stop_at_the_value_in_both_directions():
    below = engine_stopping.build_stop(_spec(stop=[{"metric": "loss", "below": 0.2}]))
    assert isinstance(below, engine_stopping.Thresholds)
    assert _feed(below, "t", [{"loss": 0.5}, {"loss": 0.2}]) == [False, True]  # <= stops
    above = engine_stopping.build_stop(_spec(stop=[{"metric": "acc", "above": 0.9}]))
    assert _feed(above, "t", [{"acc": 0.5}, {"acc": 0.9}, {"acc": 1}]) == [False, True, True]  # >=, as Tune's dict
    nested = engine_stopping.build_stop(_spec(stop=[{"metric": "val/loss", "below": 1}]))
    assert _feed(nested, "t", [{"val": {"loss": 2}}, {"val": {"loss": 1}}]) == [False, True]  # flattened, as Tune's
    assert _feed(below, "t", [{"other": 0}]) == [False]  # a result without the metric stops nothing
    assert below.stop_all() is False


def test_tunes_stoppers_by_name_take_the_specs_metric_and_mode_and_combine():
    spec = _spec(stop=COMBINED, mode="max")
    stop = engine_stopping.build_stop(spec)
    assert isinstance(stop, CombinedStopper)
    # Any one stopping stops: the "below" threshold stops this trial though no other criterion would.
    assert stop("t1", {"loss": 0.05, "acc": 0.1}) is True
    assert stop("t2", {"loss": 5, "acc": 0.1}) is False
    plateau = engine_stopping.build_stopper(spec, {"name": "trial_plateau", "args": {"std": 0.01}}, "stop[0]")
    assert isinstance(plateau, TrialPlateauStopper)
    # The spec's metric (loss), after the grace period and num_results results: a constant loss plateaus.
    assert _feed(plateau, "t", [{"loss": 1.0}] * 4) == [False, False, False, True]
    experiment = engine_stopping.build_stopper(spec, {"name": "experiment_plateau", "args": {"top": 2}}, "stop[0]")
    assert isinstance(experiment, ExperimentPlateauStopper)
    # The spec's mode (max): the top values are the highest ones; two equal best values plateau at once.
    assert _feed(experiment, "t", [{"loss": 1.0}, {"loss": 5.0}, {"loss": 5.0}]) == [False, False, True]
    assert experiment.stop_all() is True


def test_an_integer_std_reaches_experiment_plateau_as_a_float():
    # Tune refuses an int std (isinstance(std, float)); JSON writes 1.0 as 1.
    stopper = engine_stopping.build_stopper(
        _spec(), {"name": "experiment_plateau", "args": {"std": 1, "top": 2}}, "stop[0]"
    )
    assert stopper("t", {"loss": 1.0}) is False


def test_maximum_iteration_and_timeout_are_tunes_own():
    stop = engine_stopping.build_stop(
        _spec(
            stop=[{"name": "maximum_iteration", "args": {"max_iter": 2}}, {"name": "timeout", "args": {"timeout": 60}}]
        )
    )
    assert _feed(stop, "t", [{}, {}]) == [False, True]
    assert stop.stop_all() is False  # 60 s are not spent


def test_an_argument_the_clusters_stopper_does_not_take_fails_the_setup_naming_it():
    with pytest.raises(EngineError, match=r"stop\[0\] \(TimeoutStopper\): 'bogus' not taken by TimeoutStopper"):
        engine_stopping.build_stopper(_spec(), {"name": "timeout", "args": {"timeout": 1, "bogus": 2}}, "stop[0]")


def test_the_stoppers_survive_tunes_pickle_into_tuner_pkl():
    stop = engine_stopping.build_stop(_spec(stop=COMBINED))
    payload = cloudpickle.dumps(stop)
    assert b"airflow_tune.engine.stopping" in payload  # by reference: the module ships with every engine job
    pickle.dumps(engine_stopping.Thresholds([("loss", "below", 0.1)]))  # plain pickle: by reference, not by value
    restored = cloudpickle.loads(payload)
    assert restored("t", {"loss": 0.05}) is True
    assert restored("t", {"loss": 5, "acc": 0.1}) is False
