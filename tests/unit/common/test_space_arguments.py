"""A primitive's arguments given by name are bound by Tune's parameter names, in the spec's checks and in the engine,
never by the order of the object's keys (the spec file is written with sorted keys); unknown names are refused with a
did-you-mean."""

from __future__ import annotations

import inspect
import math

import pytest
from ray import tune
from ray.tune.search import sample

from airflow_tune.common.spec import ExperimentSpec, SpecError
from airflow_tune.common.spec.space import PARAMETERS, ArgumentNameError, positional_arguments
from airflow_tune.engine import build

BASE = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}


def _spec(**fields) -> ExperimentSpec:
    return ExperimentSpec.from_dict({**BASE, **fields})


def _through_the_spec_file(space: dict) -> dict:
    """The engine's domains of ``space`` as the driver builds them: from the spec file, written with sorted keys."""
    written = _spec(param_space=space).to_json()
    return build.build_param_space(ExperimentSpec.from_json(written))


def _sampler(domain):
    sampler = domain.get_sampler()
    return sampler.sampler if isinstance(sampler, sample.Quantized) else sampler


def _q(domain):
    sampler = domain.get_sampler()
    return sampler.q if isinstance(sampler, sample.Quantized) else None


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_the_names_are_tunes_own(name):
    """The table is Ray Tune's signatures (ray/tune/search/sample.py): the names, their order, which are required."""
    params = inspect.signature(getattr(tune, name)).parameters
    names, required = PARAMETERS[name]
    assert tuple(params) == names
    assert [p.name for p in params.values() if p.default is inspect.Parameter.empty] == list(names[:required])


def test_qrandn_by_name_is_bound_by_name_through_the_spec_file():
    space = _through_the_spec_file({"x": {"qrandn": {"mean": 100, "sd": 20, "q": 0.5}}})
    domain = space["x"]
    assert (_sampler(domain).mean, _sampler(domain).sd, _q(domain)) == (100, 20, 0.5)
    values = [domain.sample() for _ in range(200)]
    assert len(set(values)) > 10, values[:20]  # bound by position (sorted keys) it was qrandn(100, 0.5, 20): all 100.0
    assert all(math.isclose(v / 0.5, round(v / 0.5)) for v in values)


@pytest.mark.parametrize(
    ("named", "positional"),
    [
        ({"uniform": {"upper": 1, "lower": 0}}, {"uniform": [0, 1]}),
        ({"quniform": {"q": 0.5, "upper": 10, "lower": 0}}, {"quniform": [0, 10, 0.5]}),
        ({"loguniform": {"upper": 0.1, "lower": 1e-4}}, {"loguniform": [1e-4, 0.1]}),
        ({"qloguniform": {"upper": 1, "q": 1e-3, "lower": 1e-3, "base": 2}}, {"qloguniform": [1e-3, 1, 1e-3, 2]}),
        ({"randn": {"sd": 5, "mean": 100}}, {"randn": [100, 5]}),
        ({"randn": {"sd": 5}}, {"randn": [0.0, 5]}),
        ({"qrandn": {"sd": 20, "q": 0.5, "mean": 100}}, {"qrandn": [100, 20, 0.5]}),
        ({"randint": {"upper": 10, "lower": 1}}, {"randint": [1, 10]}),
        ({"qrandint": {"upper": 100, "q": 5, "lower": 0}}, {"qrandint": [0, 100, 5]}),
        ({"lograndint": {"upper": 1000, "lower": 1}}, {"lograndint": [1, 1000]}),
        ({"qlograndint": {"upper": 1024, "q": 2, "lower": 1}}, {"qlograndint": [1, 1024, 2]}),
    ],
)
def test_by_name_builds_the_domain_the_positional_form_builds(named, positional):
    by_name = _through_the_spec_file({"x": named})["x"]
    by_position = _through_the_spec_file({"x": positional})["x"]
    assert type(by_name) is type(by_position)
    assert type(_sampler(by_name)) is type(_sampler(by_position))
    assert (by_name.lower, by_name.upper, _q(by_name)) == (by_position.lower, by_position.upper, _q(by_position))
    if type(_sampler(by_name)).__name__ == "_Normal":
        assert (_sampler(by_name).mean, _sampler(by_name).sd) == (_sampler(by_position).mean, _sampler(by_position).sd)


def test_bounds_by_name_in_any_order_are_valid():
    assert _spec(param_space={"x": {"uniform": {"upper": 1, "lower": 0}}}).param_space["x"] == {
        "uniform": {"upper": 1, "lower": 0}
    }


@pytest.mark.parametrize(
    ("node", "words"),
    [
        ({"uniform": {"a": 0, "b": 1}}, ["uniform takes the arguments lower, upper", "'a', 'b'", '"lower": ...']),
        ({"uniform": {"low": 0, "high": 1}}, ["not 'low', 'high'", "did you mean 'lower' (for 'low')"]),
        ({"qrandn": {"mean": 100, "sd": 20, "step": 0.5}}, ["not 'step'", "mean, sd, q"]),
        ({"qloguniform": {"lower": 1e-3, "upper": 1, "Q": 1e-3}}, ["did you mean 'q' (for 'Q')"]),
        ({"qrandn": {"mean": 100, "sd": 20}}, ["qrandn needs mean, sd, q; 'q' is missing"]),
        ({"randint": {"upper": 10}}, ["randint needs lower, upper; 'lower' is missing"]),
    ],
)
def test_unknown_or_missing_names_are_refused_naming_tunes_names(node, words):
    with pytest.raises(SpecError) as info:
        _spec(param_space={"model": {"x": node}})
    [line] = [e for e in info.value.errors if e.startswith("param_space.model.x = ")]
    for word in words:
        assert word in line, line


def test_a_bad_range_by_name_names_the_bounds_as_bound():
    with pytest.raises(SpecError, match=r"lower bound 2 is not below upper bound 1"):
        _spec(param_space={"x": {"uniform": {"upper": 1, "lower": 2}}})


def test_a_searcher_reads_arguments_by_name():
    """Optuna takes qlograndint only with q 1: q named anywhere in the object is q."""
    with pytest.raises(SpecError, match=r"Optuna takes no step > 1"):
        _spec(param_space={"x": {"qlograndint": {"q": 4, "lower": 1, "upper": 1024}}}, search="optuna")
    _spec(param_space={"x": {"qlograndint": {"upper": 1024, "lower": 4, "q": 1}}}, search="optuna")


def test_the_engine_refuses_unknown_names_itself():
    with pytest.raises(build.EngineError, match=r"uniform takes the arguments lower, upper"):
        build.build_domain({"uniform": {"a": 0, "b": 1}})


def test_positional_arguments_fills_tunes_defaults_before_a_given_argument():
    assert positional_arguments("randn", {}) == []
    assert positional_arguments("randn", {"sd": 2}) == [0.0, 2]
    assert positional_arguments("qrandint", {"lower": 0, "upper": 10}) == [0, 10]
    assert positional_arguments("qlograndint", {"base": 2, "q": 1, "upper": 8, "lower": 1}) == [1, 8, 1, 2]
    with pytest.raises(ArgumentNameError):
        positional_arguments("uniform", {"lower": 0, "upper": 1, "q": 0.1})
