"""engine/factories.py and its use in build.py, pure logic: a factory's seed points in its searcher's shape ("a/b" for
every Tune searcher but HyperOpt, Ax and HEBO included though PyTorch is not installed here), and a factory's own
metric and mode handled as Tune does (the TuneConfig gives none when the scheduler carries them)."""

from __future__ import annotations

from typing import Any

import pytest
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.ax import AxSearch
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray.tune.search.bayesopt import BayesOptSearch
from ray.tune.search.bohb import TuneBOHB
from ray.tune.search.hebo import HEBOSearch
from ray.tune.search.hyperopt import HyperOptSearch
from ray.tune.search.nevergrad import NevergradSearch
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.zoopt import ZOOptSearch

from airflow_tune.common.spec import ExperimentSpec
from airflow_tune.engine import build, factories

SPACE = {"x": {"uniform": [0, 10]}, "net": {"width": {"randint": [1, 9]}, "act": {"choice": ["relu", "tanh"]}}}
POINT = {"x": 3.0, "net": {"width": 4, "act": "tanh"}}
FLAT = {"x": 3.0, "net/width": 4, "net/act": "tanh"}


def _spec(**fields: Any) -> ExperimentSpec:
    base = {"trainable": "m:f", "name": "e", "storage_path": "s3://bucket/x", "metric": "loss", "mode": "min"}
    return ExperimentSpec.from_dict({**base, "param_space": SPACE, **fields})


class OwnSearcher(Searcher):
    pass


class Subclassed(NevergradSearch):
    pass


@pytest.mark.parametrize(
    "cls", [AxSearch, BayesOptSearch, TuneBOHB, HEBOSearch, NevergradSearch, OptunaSearch, ZOOptSearch, Subclassed]
)
def test_tunes_searchers_but_hyperopt_take_flat_points(cls):
    assert factories.point_shape(object.__new__(cls)) == "flat"


@pytest.mark.parametrize("cls", [HyperOptSearch, BasicVariantGenerator, OwnSearcher])
def test_hyperopt_the_random_searcher_and_a_users_own_take_nested_points(cls):
    assert factories.point_shape(object.__new__(cls)) == "nested"


def test_the_shape_is_read_through_a_concurrency_limiter():
    assert factories.point_shape(ConcurrencyLimiter(OptunaSearch(), max_concurrent=1)) == "flat"


class Recorder:
    """A factory that records each call's points and returns ``cls()``."""

    def __init__(self, cls: type) -> None:
        self.cls, self.calls = cls, []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs.get("points_to_evaluate"))
        return object.__new__(self.cls)


def test_a_flat_searchers_factory_gets_flat_points_after_one_call_without():
    factory = Recorder(ZOOptSearch)
    factories.build_searcher(factory, {}, [POINT], SPACE)
    assert factory.calls == [None, [FLAT]]


def test_hyperopts_factory_gets_nested_points():
    factory = Recorder(HyperOptSearch)
    factories.build_searcher(factory, {}, [POINT], SPACE)
    assert factory.calls == [None, [POINT]]


def test_a_flat_space_or_no_points_calls_the_factory_once():
    factory = Recorder(NevergradSearch)
    factories.build_searcher(factory, {}, [{"x": 1.0}], {"x": {"uniform": [0, 10]}})
    factories.build_searcher(factory, {}, None, SPACE)
    assert factory.calls == [[{"x": 1.0}], None]


def test_a_nevergrad_factory_suggests_the_nested_seed_first(monkeypatch):
    """The whole path through build_search, with a seed lacking net.act: the engine fills it, hands the point over
    flat, and Nevergrad's first suggestion is the seed, nested as the trainable sees it."""
    import nevergrad as ng

    monkeypatch.setattr(
        build, "import_path", lambda path, what: lambda **kw: NevergradSearch(ng.optimizers.OnePlusOne, **kw)
    )
    spec = _spec(search={"factory": "m:nevergrad"}, points_to_evaluate=[{"x": 3.0, "net": {"width": 4}}])
    searcher = build.build_search(spec)
    assert searcher.set_search_properties("loss", "min", build.build_param_space(spec))
    first = searcher.suggest("t1")
    assert first["x"] == 3.0 and first["net"]["width"] == 4 and first["net"]["act"] in ("relu", "tanh")


def _asha(**kwargs: Any) -> Any:
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(**kwargs)


def _with_factories(monkeypatch, scheduler: Any, searcher: Any = None) -> None:
    made = {"m:scheduler": scheduler, "m:searcher": searcher}
    monkeypatch.setattr(build, "import_path", lambda path, what: lambda **kw: made[path])


def test_a_scheduler_with_the_specs_own_metric_leaves_the_tune_config_without(monkeypatch):
    """Tune raises at fit() when both give one; the named searcher gets the spec's objective itself."""
    _with_factories(monkeypatch, _asha(metric="loss", mode="min"))
    config = build.build_tune_config(_spec(scheduler={"factory": "m:scheduler"}, search="optuna"))
    assert (config.metric, config.mode) == (None, None)
    assert (config.search_alg.metric, config.search_alg.mode) == ("loss", "min")
    assert config.scheduler.set_search_properties(config.metric, config.mode)  # what Tune checks at fit()


def test_a_scheduler_without_its_own_metric_gets_the_specs(monkeypatch):
    _with_factories(monkeypatch, _asha())
    config = build.build_tune_config(_spec(scheduler={"factory": "m:scheduler"}))
    assert (config.metric, config.mode) == ("loss", "min")


@pytest.mark.parametrize(("metric", "mode"), [("acc", "min"), ("loss", "max"), ("acc", None)])
def test_a_factorys_other_objective_is_refused(monkeypatch, metric, mode):
    _with_factories(monkeypatch, _asha(metric=metric, mode=mode))
    with pytest.raises(build.EngineError, match=r"scheduler.factory 'm:scheduler' built a AsyncHyperBandScheduler"):
        build.build_tune_config(_spec(scheduler={"factory": "m:scheduler"}))
    _with_factories(monkeypatch, _asha(), OptunaSearch(metric=metric, mode=mode or "min"))
    with pytest.raises(build.EngineError, match=r"search.factory 'm:searcher' built a OptunaSearch .* the spec's"):
        build.build_tune_config(_spec(scheduler={"factory": "m:scheduler"}, search={"factory": "m:searcher"}))


def test_a_searcher_without_an_objective_beside_a_scheduler_with_one_is_refused(monkeypatch):
    _with_factories(monkeypatch, _asha(metric="loss", mode="min"), OptunaSearch())
    spec = _spec(scheduler={"factory": "m:scheduler"}, search={"factory": "m:searcher"})
    with pytest.raises(build.EngineError, match="the OptunaSearch search.factory 'm:searcher' built has none"):
        build.build_tune_config(spec)
    _with_factories(monkeypatch, _asha(metric="loss", mode="min"), OptunaSearch(metric="loss", mode="min"))
    assert build.build_tune_config(spec).metric is None


def test_an_ax_factory_gets_the_spaces_constants_in_its_points():
    """AxSearch makes every constant of the space a fixed parameter (list items too) and its ``attach_trial``
    refuses a point without them, as in plain Tune: the engine adds them, as Ax names them."""
    space = {**SPACE, "steps": 2, "net": {**SPACE["net"], "depth": 3}, "layers": [8, 4]}
    tune_space = build.build_param_space(_spec(param_space=space))
    factory = Recorder(AxSearch)
    factories.build_searcher(factory, {}, [POINT], space, tune_space)
    assert factory.calls == [None, [{**FLAT, "steps": 2, "net/depth": 3, "layers/0": 8, "layers/1": 4}]]


def test_only_an_ax_factory_gets_the_constants():
    space = {**SPACE, "steps": 2}
    factory = Recorder(OptunaSearch)
    factories.build_searcher(factory, {}, [POINT], space, build.build_param_space(_spec(param_space=space)))
    assert factory.calls == [None, [FLAT]]


def _fake_ax(monkeypatch, objective: type, release: str) -> None:
    import importlib.metadata
    import sys
    import types

    module = types.ModuleType("ax.core.objective")
    module.Objective = objective  # type: ignore[attr-defined]
    for name in ("ax", "ax.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "ax.core.objective", module)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: release if name == "ax-platform" else "0")


def test_an_ax_platform_rays_axsearch_cannot_drive_is_refused_naming_both(monkeypatch):
    """ax-platform 1.3 removed Objective.metric, which Ray's AxSearch reads at its first trial."""
    _fake_ax(monkeypatch, type("Objective", (), {}), "1.3.1")
    with pytest.raises(factories.EngineError, match=r"ax-platform 1\.3\.1 .*Objective\.metric.*ax-platform<1\.3"):
        factories.check_ax_platform(object.__new__(AxSearch))


def test_an_ax_platform_with_objective_metric_and_other_searchers_pass(monkeypatch):
    _fake_ax(monkeypatch, type("Objective", (), {"metric": property(lambda self: None)}), "1.2.4")
    factories.check_ax_platform(object.__new__(AxSearch))
    _fake_ax(monkeypatch, type("Objective", (), {}), "1.3.1")
    factories.check_ax_platform(object.__new__(HEBOSearch))
