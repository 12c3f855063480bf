"""build.py, pure logic: every search-space primitive becomes the right Tune domain; resources; trainable wrapping."""

from __future__ import annotations

import math

import pytest
from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.search import sample

from airflow_tune.common.spec import PRIMITIVES, ExperimentSpec
from airflow_tune.engine import build


def _spec(**fields) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, **fields})


def _sampler(domain):
    sampler = domain.get_sampler()
    return sampler.sampler if isinstance(sampler, sample.Quantized) else sampler


def _q(domain):
    sampler = domain.get_sampler()
    return sampler.q if isinstance(sampler, sample.Quantized) else None


@pytest.mark.parametrize(
    ("node", "cls", "sampler", "lower", "upper", "q", "base"),
    [
        ({"uniform": [0.5, 2]}, sample.Float, "_Uniform", 0.5, 2, None, None),
        ({"quniform": [0, 10, 0.5]}, sample.Float, "_Uniform", 0, 10, 0.5, None),
        ({"loguniform": [1e-4, 1e-1]}, sample.Float, "_LogUniform", 1e-4, 1e-1, None, 10),
        ({"loguniform": [1e-4, 1e-1, 2]}, sample.Float, "_LogUniform", 1e-4, 1e-1, None, 2),
        ({"qloguniform": [1e-4, 1, 1e-4]}, sample.Float, "_LogUniform", 1e-4, 1, 1e-4, 10),
        ({"qloguniform": [1, 1024, 1, 2]}, sample.Float, "_LogUniform", 1, 1024, 1, 2),
        ({"randint": [1, 10]}, sample.Integer, "_Uniform", 1, 10, None, None),
        ({"qrandint": [0, 100, 5]}, sample.Integer, "_Uniform", 0, 100, 5, None),
        ({"lograndint": [1, 1000]}, sample.Integer, "_LogUniform", 1, 1000, None, 10),
        ({"qlograndint": [1, 1024, 2, 2]}, sample.Integer, "_LogUniform", 1, 1024, 2, 2),
    ],
)
def test_numeric_primitives(node, cls, sampler, lower, upper, q, base):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a log base is dropped, not passed to Ray (deprecated there)
        domain = build.build_domain(node)
    assert type(domain) is cls
    assert (domain.lower, domain.upper) == (lower, upper)
    assert type(_sampler(domain)).__name__ == sampler
    assert _q(domain) == q
    values = [domain.sample() for _ in range(50)]
    assert all(lower <= v <= upper for v in values)
    if cls is sample.Integer:
        assert all(isinstance(v, int) for v in values)
    if q is not None:
        assert all(math.isclose(v / q, round(v / q), abs_tol=1e-6) for v in values)


def test_normal_primitives():
    std = build.build_domain({"randn": []})
    assert type(std) is sample.Float and type(_sampler(std)).__name__ == "_Normal"
    assert (_sampler(std).mean, _sampler(std).sd) == (0.0, 1.0)
    shifted = build.build_domain({"randn": [5, 2]})
    assert (_sampler(shifted).mean, _sampler(shifted).sd) == (5, 2)
    quantized = build.build_domain({"qrandn": [0, 1, 0.25]})
    assert type(_sampler(quantized)).__name__ == "_Normal" and _q(quantized) == 0.25


def test_choice_grid_const_and_nesting():
    choice = build.build_domain({"choice": [2, 4, {"uniform": [0, 1]}]})
    assert type(choice) is sample.Categorical
    assert choice.categories[:2] == [2, 4] and type(choice.categories[2]) is sample.Float
    assert build.build_domain({"grid_search": [16, 32]}) == {"grid_search": [16, 32]}
    # const keeps a dict that would otherwise read as a primitive.
    assert build.build_domain({"const": {"uniform": [0, 1]}}) == {"uniform": [0, 1]}
    nested = build.build_domain({"opt": {"lr": {"loguniform": [1e-3, 1]}, "name": "adam"}, "layers": [1, 2]})
    assert type(nested["opt"]["lr"]) is sample.Float and nested["opt"]["name"] == "adam"
    assert nested["layers"] == [1, 2]


def test_sample_from_imports_the_function():
    domain = build.build_domain({"sample_from": "math:sqrt"})
    assert type(domain) is sample.Function
    with pytest.raises(build.EngineError, match="cannot import module 'no_such_mod'"):
        build.build_domain({"sample_from": "no_such_mod:f"})


def test_every_primitive_is_covered():
    covered = {
        "uniform", "quniform", "loguniform", "qloguniform", "randn", "qrandn", "randint", "qrandint",
        "lograndint", "qlograndint", "choice", "grid_search", "sample_from", "const",
    }  # fmt: skip
    assert covered == set(PRIMITIVES)


def test_param_space_from_spec():
    spec = _spec(param_space={"x": {"uniform": [0, 1]}, "n": 3, "choice": {"choice": [1, 2]}})
    space = build.build_param_space(spec)
    assert type(space["x"]) is sample.Float and space["n"] == 3 and type(space["choice"]) is sample.Categorical


# --- resources ------------------------------------------------------------------------------------------------------
def test_resources_none_leaves_tune_defaults():
    assert build.build_resources(_spec()) is None


def test_resources_plain_dict():
    assert build.build_resources(_spec(resources={"cpu": 2, "gpu": 0.5, "memory": 1e9})) == {
        "cpu": 2,
        "gpu": 0.5,
        "memory": 1e9,
    }


def test_resources_custom_resource_becomes_a_bundle():
    pgf = build.build_resources(_spec(resources={"cpu": 1, "accel": 2}))
    assert isinstance(pgf, PlacementGroupFactory)
    assert pgf.bundles == [{"CPU": 1, "accel": 2}]
    assert pgf.required_resources == {"CPU": 1, "accel": 2}


def test_resources_bundles_and_strategy():
    pgf = build.build_resources(_spec(resources={"bundles": [{"cpu": 1}, {"CPU": 1, "gpu": 0}], "strategy": "SPREAD"}))
    assert isinstance(pgf, PlacementGroupFactory)
    assert pgf.bundles == [{"CPU": 1}, {"CPU": 1}]  # zero amounts dropped
    assert pgf.strategy == "SPREAD"


# --- trainables -----------------------------------------------------------------------------------------------------
class _NoSave(tune.Trainable):
    def step(self):
        return {"loss": 1}


class _Saves(_NoSave):
    def save_checkpoint(self, checkpoint_dir):
        return None

    def load_checkpoint(self, checkpoint):
        return None


def test_saves_checkpoints():
    assert not build.saves_checkpoints(_NoSave)
    assert build.saves_checkpoints(_Saves)


def test_checkpoint_at_end_defaults_off_for_class_that_cannot_save(monkeypatch):
    monkeypatch.setattr(build, "import_path", lambda path, what: {"m:nosave": _NoSave, "m:saves": _Saves}[path])
    assert build.checkpoint_at_end(_spec(trainable="m:nosave")) is False
    assert build.checkpoint_at_end(_spec(trainable="m:saves")) is None  # Tune's default (True for classes)
    assert build.checkpoint_at_end(_spec(trainable="m:saves", checkpoint={"at_end": False})) is False
    with pytest.raises(build.EngineError, match="does not implement save_checkpoint"):
        build.build_trainable(_spec(trainable="m:nosave", checkpoint={"frequency": 2}))


def test_function_checkpoint_fields_are_refused(monkeypatch):
    monkeypatch.setattr(build, "import_path", lambda path, what: lambda config: None)
    with pytest.raises(build.EngineError, match="Class API trainables only"):
        build.build_trainable(_spec(checkpoint={"at_end": True}))


def test_report_zero_return_reports_a_zero_and_keeps_the_rest(monkeypatch):
    reported = []
    monkeypatch.setattr(build.tune, "report", lambda metrics: reported.append(metrics))

    def returns(value):
        def fn(config, **kwargs):
            """doc"""
            return value

        return build.report_zero_return(fn)

    assert returns(0)({}) is None and reported == [{"_metric": 0}]
    assert returns(0.0)({}) is None and reported[-1] == {"_metric": 0.0}
    reported.clear()
    assert returns(2.5)({}) == 2.5 and returns({"a": 0})({}) == {"a": 0} and returns(None)({}) is None
    assert returns(False)({}) is False
    assert reported == []
    wrapped = returns(1)
    assert wrapped.__name__ == "fn" and wrapped.__doc__ == "doc"


def test_missing_package_in_factory_names_it(monkeypatch):
    def factory(**kwargs):
        import airflow_tune_no_such_pkg  # noqa: F401

    monkeypatch.setattr(build, "import_path", lambda path, what: factory)
    with pytest.raises(build.EngineError, match="needs the package 'airflow_tune_no_such_pkg'"):
        build.build_search(_spec(search={"factory": "m:factory"}))
    with pytest.raises(build.EngineError, match="needs the package 'airflow_tune_no_such_pkg'"):
        build.build_scheduler(_spec(scheduler={"factory": "m:factory"}))


def test_missing_package_of_a_named_searcher_names_what_to_install(monkeypatch):
    find_spec = build.importlib.util.find_spec
    monkeypatch.setattr(
        build.importlib.util, "find_spec", lambda name: None if name == "bayes_opt" else find_spec(name)
    )
    with pytest.raises(build.EngineError, match="the bayesopt searcher needs the package 'bayesian-optimization'"):
        build.build_search(_spec(param_space={"x": {"uniform": [0, 1]}}, search="bayesopt"))


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ({"max_concurrent_trials": 1}, 1),
        ({"search": {"name": "random", "max_concurrent": 3}}, 3),
        ({"max_concurrent_trials": 2, "search": {"name": "random", "max_concurrent": 3}}, 2),
        ({"max_concurrent_trials": 2, "search": "optuna"}, 2),
        ({}, None),
    ],
)
def test_the_concurrency_limit_reaches_the_search_algorithm(fields, limit):
    """Tune 2.60 ignores TuneConfig(max_concurrent_trials) for a BasicVariantGenerator instance: it goes to the
    generator (or a ConcurrencyLimiter around a Searcher) instead, and TuneConfig gets None."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.basic_variant import BasicVariantGenerator

    base = {"trainable": "m:f", "name": "n", "storage_path": "/tmp/aft-x", "metric": "loss", "mode": "min"}
    spec = ExperimentSpec.from_dict({**base, "param_space": {"x": {"choice": [1, 2]}}, **fields})
    search = build.build_search(spec)
    if isinstance(search, BasicVariantGenerator):
        assert search.max_concurrent == (limit or 0)
    elif limit:
        assert isinstance(search, ConcurrencyLimiter) and search.max_concurrent == limit
    assert build.build_tune_config(spec).max_concurrent_trials is None


def test_resource_changing_by_name_is_tunes_default():
    """``tune.create_scheduler("resource_changing")``: a FIFO base scheduler and Tune's DistributeResources."""
    from ray.tune.schedulers import FIFOScheduler, ResourceChangingScheduler
    from ray.tune.schedulers.resource_changing_scheduler import DistributeResources

    scheduler = build.build_scheduler(_spec(scheduler="resource_changing"))
    assert isinstance(scheduler, ResourceChangingScheduler)
    assert isinstance(scheduler._base_scheduler, FIFOScheduler)
    assert isinstance(scheduler._resources_allocation_function, DistributeResources)
